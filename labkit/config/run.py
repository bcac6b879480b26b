"""Run configuration: what to run, on how many ranks, for how long -- resolved and validated
up front.

``RunConfig(strategy="ddp")`` takes what the user gives (``None`` for "the default", a model
as a kind or a dict, options as a dict, a fault as ``"1:3:raise"``) and returns a config
whose every field holds its resolved value, typed as such: ``config.steps`` is an int,
``config.model`` a ``ModelConfig``, ``config.options`` the strategy's options dataclass.

How, without metaprogramming: the class is a frozen dataclass with ``init=False`` and a
``__new__`` whose keyword-only signature is the public constructor. ``resolve`` is the one
function that turns the given values into the resolved ones (the model from a kind or a
dict; steps / lr / optimizer / batch size from explicit > strategy default > model
default; the world size, the timeout, the fault and the options), ``__new__`` fills the
fields once with them and checks every rule, and nothing writes a field afterwards. A
dataclass ``__post_init__`` could not do this without writing to its own frozen fields,
and declaring the fields with their *given* types (``int | None``) would make every reader
assert the ``None`` away. Pickles and copies carry the resolved fields as they are
(``__reduce__``); ``replace`` resolves and validates again.

Every problem -- each field's type (a bool is not an int, 2.0 is not an integer, ``inf`` is
not a number of seconds) and range, then the rules across fields -- is raised as one
``ConfigError`` naming *all* offending values, before any process starts
(``labkit.config.rules`` words the shared rules). Strategy-specific settings live in the
strategy's own options dataclass, registered with ``labkit.strategies``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from labkit.base import devices
from labkit.base.errors import ConfigError
from labkit.base.validate import as_plain, bool_problem, choice_problem, int_problem, is_int, real_problem
from labkit.config.model import MODEL_DEFAULTS, MODELS, ModelConfig
from labkit.config.rules import (
    BACKENDS,
    FAULT_KINDS,
    LAUNCHERS,
    MAX_BATCH,
    MAX_LR,
    MAX_STEPS,
    MAX_THREADS,
    MAX_TIMEOUT_S,
    OPTIMIZERS,
    SEED_MAX,
    FaultSpec,
    auto_backend,
    backend_problem,
    settings_problems,
)

__all__ = ["BACKENDS", "FAULT_KINDS", "LAUNCHERS", "MAX_THREADS", "MAX_TIMEOUT_S", "MODELS",
           "MODEL_DEFAULTS", "OPTIMIZERS", "SEED_MAX", "FaultSpec", "ModelConfig", "RunConfig",
           "resolve"]

BATCH_SIZE = 32
"""Samples per data-parallel rank per step when neither the run nor its strategy says."""
WORLD_SIZE = 2
"""Ranks when neither the run nor its strategy says."""


@dataclass(kw_only=True, frozen=True, init=False)
class RunConfig:
    """One multi-process run: ``labkit.run(RunConfig(strategy="ddp", world_size=2))``."""

    strategy: str
    """Registered strategy name, e.g. "ddp" (see ``labkit.strategies.names()``)."""
    world_size: int
    """Number of ranks (processes) to start; None: the strategy's default (2, or the product
    of a hybrid run's dp x pp x tp)."""
    steps: int
    """Training steps (optimizer updates); None: the model's default (mlp 10, gpt 40,
    digits 300)."""
    backend: str
    """auto (NCCL with one GPU per rank when there are enough GPUs, else gloo), gloo or nccl."""
    timeout_s: float
    """Seconds the whole run may take before it is stopped and the hung ranks are named;
    None: the model's default (mlp 60, gpt 120) times world_size / cores when the ranks
    outnumber the cores (they take turns)."""
    seed: int
    """Seed for the model, the data and every rank's RNGs."""
    batch_size: int
    """Samples per data-parallel rank per step (global batch = batch_size x dp ranks);
    None: the strategy's default, else 32."""
    lr: float
    """Learning rate of the optimizer; None: the strategy's or the model's default (mlp 0.05)."""
    optimizer: str
    """sgd, momentum (SGD, momentum 0.9), adam, lars or lamb (layer-wise, for large batches);
    None: the strategy's or the model's default (mlp: sgd, gpt: momentum)."""
    model: ModelConfig
    """The model and its shape: a ModelConfig (used as given), a kind ("mlp", "gpt",
    "digits") or a dict of ModelConfig fields (the fields not given take the strategy's
    default shape for that kind, else ModelConfig's); None: "mlp"."""
    options: Any
    """Strategy options: the strategy's own dataclass (given as one or as a dict of its
    fields); None for a strategy that takes none."""
    trace: bool
    """Record the per-rank timeline (turn off only to measure tracing overhead)."""
    check_reference: bool
    """Also train one process on the global batch and report the max abs weight difference."""
    inject_fault: FaultSpec | None
    """Fail a rank on purpose, e.g. "1:3:raise" (rank 1, step 3, raise an exception), or the
    same as ``{"rank": 1, "step": 3, "kind": "raise"}``."""
    threads_per_rank: int | None
    """Torch threads per rank; default: CPU cores // world_size (at least 1)."""
    progress: bool | None
    """Show a progress bar (steps across ranks); None shows one when a run takes > 2 s."""
    nodes: int
    """Emulated nodes: Linux network namespaces on this machine, one torchrun agent each,
    world_size / nodes ranks per node (see ``labkit.launchers.cluster``)."""
    link: str | None
    """The wire between emulated nodes: a preset such as "infiniband_hdr" (see
    ``labkit.launchers.cluster.PRESETS``) or "RATE[,LATENCY]" such as "200mbit,1ms"; None: unshaped."""
    launcher: str
    """Who starts the ranks: labkit (its own supervisor) or ray (Ray Train's TorchTrainer,
    ``labkit.launchers.ray``); the same rank code and the same RunResult either way."""

    def __new__(cls, *, strategy: str, world_size: int | None = None, steps: int | None = None,
                backend: str = "auto", timeout_s: float | None = None, seed: int = 0,
                batch_size: int | None = None, lr: float | None = None,
                optimizer: str | None = None,
                model: ModelConfig | str | dict[str, Any] | None = None, options: Any = None,
                trace: bool = True, check_reference: bool = False,
                inject_fault: FaultSpec | str | dict[str, Any] | None = None,
                threads_per_rank: int | None = None, progress: bool | None = None,
                nodes: int = 1, link: str | None = None, launcher: str = "labkit") -> RunConfig:
        given = {name: value for name, value in locals().items() if name != "cls"}
        values, problems = resolve(given)
        config = _filled(cls, values)
        problems += config._problems()
        if not problems:  # the strategy's own rules read a config that holds every other
            problems = config._strategy_problems()
        if problems:
            raise ConfigError(problems)
        return config

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles and copies carry the resolved fields; ``__new__`` is not run again."""
        return _filled, (type(self), dict(self.__dict__))

    # ---- rules ---------------------------------------------------------------------------
    def _problems(self) -> list[str]:
        """Each field's own type and range, then the rules across fields."""
        checks = [
            int_problem("world_size", self.world_size, 1, example=2),
            int_problem("steps", self.steps, 1, MAX_STEPS, example=10,
                        why=" (the timeline keeps every step in memory)"),
            *settings_problems(timeout_s=self.timeout_s, seed=self.seed,
                               threads_per_rank=self.threads_per_rank, trace=self.trace),
            int_problem("batch_size", self.batch_size, 1, MAX_BATCH, example=32,
                        why=" samples per rank"),
            real_problem("lr", self.lr, MAX_LR, example=0.05,
                         why=" (larger steps diverge with every optimizer here)"),
            choice_problem("optimizer", self.optimizer, OPTIMIZERS),
            bool_problem("check_reference", self.check_reference),
            bool_problem("progress", self.progress, optional=True),
            choice_problem("launcher", self.launcher, LAUNCHERS),
            *self.model.problems(),
            backend_problem(self.backend, self.world_size),
        ]
        problems = [p for p in checks if p is not None]
        if self.launcher == "ray" and self.nodes != 1:
            problems.append(f"launcher 'ray' starts every rank on this machine's Ray; emulated "
                            f"nodes ({self.nodes}) need launcher 'labkit' (the default)")
        if self.nodes != 1 or self.link is not None:
            from labkit.config.cluster import config_problems

            problems += config_problems(self)
        if self.inject_fault is not None and is_int(self.world_size) and is_int(self.steps):
            problems += self.inject_fault.problems(self.world_size, self.steps)
        return problems

    def _strategy_problems(self) -> list[str]:
        """The registered strategy's rules across fields (``Strategy.check``)."""
        from labkit.config import registry

        check = registry.get(self.strategy).check
        return check(self) if check is not None else []

    # ---- derived values --------------------------------------------------------------------
    def resolved_backend(self) -> str:
        """The backend the ranks will use: ``auto`` becomes nccl or gloo."""
        if self.backend != "auto":
            return self.backend
        if self.nodes > 1:
            return "gloo"  # emulated nodes talk over a shaped TCP link (labkit.launchers.cluster)
        from labkit.config import registry
        spec = registry.lookup(self.strategy)
        if spec is not None and "nccl" not in spec.backends:
            return "gloo"
        return auto_backend(self.world_size)

    def threads(self) -> int:
        return self.threads_per_rank or devices.default_threads_per_rank(self.world_size)

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (resolved and validated again)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, FaultSpec):
                v = str(v)  # "RANK:STEP:KIND", as the CLI takes it
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                v = dataclasses.asdict(v)
            d[f.name] = v
        return d


def _filled(cls: type[RunConfig], values: dict[str, Any]) -> RunConfig:
    """A ``cls`` whose fields hold ``values``, written once, as a frozen dataclass's own
    ``__init__`` writes them (used by ``__new__`` and by unpickling)."""
    config = object.__new__(cls)
    config.__dict__.update(values)
    return config


def resolve(given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Every field's resolved value from the values ``RunConfig`` was given, and the problems
    found while resolving (an unknown strategy, a model, fault or options that cannot be
    read). The one place defaults are chosen:

    1. the model: a ModelConfig as given, else a kind or a dict over the strategy's shape
       for that kind, over ``ModelConfig``'s defaults;
    2. steps, lr, optimizer, batch size: explicit > strategy default > model default;
    3. the options: the strategy's dataclass (from a dict of its fields);
    4. the world size: explicit > the strategy's (from its options) > 2;
    5. the timeout: explicit > model default x world_size / cores when ranks share cores;
    6. the fault: a FaultSpec from ``"RANK:STEP:KIND"`` or a dict.
    Numpy scalars become the Python numbers they hold.
    """
    from labkit.config import registry

    values = {name: as_plain(value) for name, value in given.items()}
    strategy = values["strategy"]
    spec = registry.lookup(strategy) if isinstance(strategy, str) else None
    problems = [] if spec is not None else [
        f"strategy {strategy!r} is not registered; known: {', '.join(registry.names())}"]
    # 1. the model
    values["model"], wrong = _model(values["model"], spec)
    problems += wrong
    # 2. the training settings
    defaults = {**MODEL_DEFAULTS.get(values["model"].kind, MODEL_DEFAULTS["mlp"]),
                "batch_size": BATCH_SIZE, **(spec.defaults if spec is not None else {})}
    for name in ("steps", "lr", "optimizer", "batch_size"):
        if values[name] is None:
            values[name] = defaults[name]
    # 3. the options
    values["options"], wrong = _options(strategy, spec, values["options"])
    problems += wrong
    # 4. the world size
    if values["world_size"] is None:
        values["world_size"] = WORLD_SIZE
        if spec is not None and spec.default_world_size is not None and not wrong:
            values["world_size"] = spec.default_world_size(values["options"])
    # 5. the timeout: capped, since a world size too large for any machine is world_size's
    # rule to name, not a timeout the user never set
    if values["timeout_s"] is None:
        size = values["world_size"]
        share = max(1.0, size / devices.cpu_count()) if is_int(size) else 1.0
        values["timeout_s"] = min(defaults["timeout_s"] * share, MAX_TIMEOUT_S)
    # 6. the fault
    values["inject_fault"], wrong = FaultSpec.given(values["inject_fault"])
    return values, problems + wrong


def _model(model: Any, spec: Any) -> tuple[ModelConfig, list[str]]:
    """Step 1 of ``resolve``: the ModelConfig a run trains."""
    if model is None:
        model = "mlp"
    if isinstance(model, str):
        model = {"kind": model}
    if isinstance(model, ModelConfig):
        return model, []
    if not isinstance(model, dict):
        return ModelConfig(), [
            f"model ({model!r}) must be a ModelConfig, a kind ({', '.join(MODELS)}) or a dict "
            f"of its fields, not {type(model).__name__}; e.g. model={{'kind': 'gpt', "
            f"'width': 256}}"]
    known = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = sorted(set(model) - set(known), key=str)
    if unknown:
        return ModelConfig(), [
            f"model has unknown key(s) {', '.join(map(str, unknown))}; known: "
            f"{', '.join(known)}; e.g. model={{'kind': 'gpt', 'width': 256}}"]
    kind = model.get("kind", "mlp")
    shape = (spec.defaults.get("model", {}) if spec is not None else {}).get(
        kind if isinstance(kind, str) else "mlp", {})
    if callable(shape):  # a shape that depends on what was given (e.g. in_dim = width)
        shape = shape(model)
    return ModelConfig(**{**shape, **model}), []


def _options(strategy: Any, spec: Any, opts: Any) -> tuple[Any, list[str]]:
    """Step 3 of ``resolve``: the strategy's options dataclass (None if it takes none)."""
    if spec is None:
        return opts, []
    if spec.options is None:
        if opts not in (None, {}):
            return opts, [f"strategy {strategy!r} takes no options, got {opts!r}"]
        return None, []
    if opts is None:
        opts = {}
    if isinstance(opts, dict):
        known = {f.name for f in dataclasses.fields(spec.options)}
        unknown = sorted(set(opts) - known)
        if unknown:
            return opts, [f"unknown option(s) {', '.join(unknown)} for strategy {strategy!r}; "
                          f"known: {', '.join(sorted(known))}"]
        try:
            opts = spec.options(**opts)
        except ConfigError as err:
            return opts, err.problems
    if not isinstance(opts, spec.options):
        return opts, [f"options for {strategy!r} must be {spec.options.__name__} or a dict, "
                      f"got {type(opts).__name__}"]
    return opts, []
