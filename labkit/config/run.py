"""Run configuration: what to run, on how many ranks, for how long — validated up front.

Every field carries a docstring line with its unit. ``__post_init__`` checks every rule --
each field's type (a bool is not an int, 2.0 is not an integer, ``inf`` is not a number of
seconds) and range, then the rules across fields -- and raises one ``ConfigError`` naming
*all* offending values, before any process starts (``labkit.base.validate`` words the rules).
Strategy-specific settings live in the strategy's own options dataclass
(``RunConfig.options``), registered with ``labkit.strategies``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from labkit.base import devices
from labkit.base.errors import ConfigError
from labkit.base.validate import (
    as_plain,
    bool_problem,
    choice_problem,
    int_problem,
    is_int,
    real_problem,
)

BACKENDS = ("auto", "gloo", "nccl")
FAULT_KINDS = ("raise", "exit", "kill", "hang")
OPTIMIZERS = ("sgd", "momentum", "adam", "lars", "lamb")
LAUNCHERS = ("labkit", "ray")
MAX_STEPS = 100_000  # the timeline keeps every step's spans in memory
MAX_BATCH = 65_536  # samples per rank per step
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # one week; gloo's own timeout is derived from it
MAX_LR = 100.0  # a larger step diverges with every optimizer here
SEED_MAX = 2**32 - 1  # what numpy and torch generators both accept (torch seeds derive from it)
MAX_DIM = 65_536  # units of one layer (in_dim, width, out_dim)
MAX_DEPTH = 256
MAX_PARAMS = 250_000_000  # 1 GB of fp32 weights per copy, before gradients and optimizer state
MAX_THREADS = 256


@dataclass(kw_only=True, frozen=True)
class FaultSpec:
    """A fault to inject on purpose, for lessons and tests: ``RANK:STEP:KIND``."""

    rank: int
    """The global rank that fails."""
    step: int
    """The step (0-based) at whose start it fails."""
    kind: str
    """raise (a Python exception), exit (os._exit(3)), kill (SIGKILL itself), hang (sleep)."""

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``"1:3:raise"`` -> FaultSpec(rank=1, step=3, kind="raise")."""
        parts = text.split(":")
        try:
            rank, step, kind = parts
            ints = int(rank), int(step)
        except ValueError:
            raise ConfigError(f"inject_fault {text!r} must look like RANK:STEP:KIND with KIND one "
                              f"of {', '.join(FAULT_KINDS)}; e.g. '1:3:raise'") from None
        return cls(rank=ints[0], step=ints[1], kind=kind)

    def __post_init__(self) -> None:
        problems = [p for p in (
            int_problem("inject_fault rank", self.rank, 0, example=1),
            int_problem("inject_fault step", self.step, 0, example=3),
            None if isinstance(self.kind, str) else
            f"inject_fault kind ({self.kind!r}) must be one of {', '.join(FAULT_KINDS)}")
            if p is not None]
        if problems:
            raise ConfigError(problems)

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"


MODELS = ("mlp", "gpt", "digits")

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "mlp": {"steps": 10, "lr": 0.05, "optimizer": "sgd", "timeout_s": 60.0},
    # momentum, not Adam: Adam's 1/sqrt(v) amplified float-rounding differences to 0.039
    # from one process over 40 GPT steps, past the 1e-5 reference checks
    "gpt": {"steps": 40, "lr": 0.1, "optimizer": "momentum", "timeout_s": 120.0},
    "digits": {"steps": 300, "lr": 0.1, "optimizer": "momentum", "timeout_s": 60.0},
}
"""Training settings a run of each model uses unless it (or its strategy) says otherwise:
enough for the loss to fall visibly in a default run of a few seconds."""


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """The model a run trains: the seeded MLP (default), a small GPT or a digits classifier.

    ``kind`` picks the model and its data (``labkit.train.data``): ``mlp`` Linear+ReLU blocks on a
    synthetic classification task; ``gpt`` a decoder-only transformer (``labkit.train.models.gpt``)
    predicting the next character of Python's own source; ``digits`` Linear+ReLU blocks on
    the 8x8 handwritten digits (UCI, shipped with labkit), with the accuracy on held-out images reported.
    """

    kind: str = "mlp"
    """mlp, gpt or digits."""
    in_dim: int = 32
    """Input features per sample (mlp; digits images always have 64)."""
    width: int = 128
    """Hidden units per layer (gpt: the model width h)."""
    depth: int = 4
    """Hidden Linear+ReLU blocks (gpt: transformer blocks)."""
    out_dim: int = 10
    """Classes of the synthetic task (mlp; digits always has 10)."""
    heads: int = 4
    """Attention heads (gpt, and the blocks `labkit run tp` trains); width must be a multiple
    of heads."""
    seq_len: int = 64
    """Tokens per sample (gpt)."""
    vocab_size: int | None = None
    """gpt: None for characters (96 symbols) or N for the N most frequent word pieces."""

    def problems(self) -> list[str]:
        """Every broken rule (checked by the ``RunConfig`` that holds this model)."""
        limits = {"in_dim": MAX_DIM, "width": MAX_DIM, "depth": MAX_DEPTH, "out_dim": MAX_DIM,
                  "heads": MAX_DIM, "seq_len": MAX_DIM}
        out = [p for name, hi in limits.items()
               if (p := int_problem(f"model.{name}", getattr(self, name), 1, hi,
                                    example=getattr(ModelConfig, name))) is not None]
        if self.kind not in MODELS:
            out.append(f"model.kind {self.kind!r} must be one of {', '.join(MODELS)}; "
                       f"e.g. model='gpt'")
        if out:
            return out
        if self.kind == "gpt":
            if self.width % self.heads:
                out.append(f"model.width ({self.width}) must be a multiple of model.heads "
                           f"({self.heads}) so every head has the same size; e.g. width=128, "
                           f"heads=4")
            if self.seq_len < 2:
                out.append(f"model.seq_len ({self.seq_len}) must be >= 2 tokens; e.g. 64")
            if self.vocab_size is not None and (
                    int_problem("model.vocab_size", self.vocab_size, 97, 16384, example=2048)):
                out.append(f"model.vocab_size ({self.vocab_size!r}) must be None (characters) "
                           f"or an integer from 97 to 16384 word pieces; e.g. vocab_size=2048")
        if not out and self.parameters() > MAX_PARAMS:
            out.append(f"model ({self.kind}, width {self.width}, depth {self.depth}) has "
                       f"{self.parameters():,} parameters; it must have <= {MAX_PARAMS:,} (1 GB "
                       f"of fp32 weights per copy, before gradients and optimizer state); "
                       f"e.g. width=1024, depth=4")
        return out

    def parameters(self) -> int:
        """Weights and biases of the model (``labkit.train.training.build_model``)."""
        if self.kind == "gpt":
            from labkit.theory.parallel3d import gpt_params

            vocab = 96 if self.vocab_size is None else self.vocab_size
            return gpt_params(vocab, self.width, self.depth, self.seq_len)["total"]
        in_dim, out_dim = (64, 10) if self.kind == "digits" else (self.in_dim, self.out_dim)
        hidden = (in_dim + 1) * self.width + (self.depth - 1) * (self.width + 1) * self.width
        return int(hidden + (self.width + 1) * out_dim)


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """One multi-process run: ``labkit.run(RunConfig(strategy="ddp", world_size=2))``."""

    strategy: str
    """Registered strategy name, e.g. "ddp" (see ``labkit.strategies.names()``)."""
    world_size: int = None  # type: ignore[assignment]  # None: resolved in __post_init__
    """Number of ranks (processes) to start; None: the strategy's default (2, or the product
    of a hybrid run's dp x pp x tp)."""
    steps: int = None  # type: ignore[assignment]
    """Training steps (optimizer updates); None: the model's default (mlp 10, gpt 40,
    digits 300)."""
    backend: str = "auto"
    """auto (NCCL with one GPU per rank when there are enough GPUs, else gloo), gloo or nccl."""
    timeout_s: float = None  # type: ignore[assignment]
    """Seconds the whole run may take before it is stopped and the hung ranks are named;
    None: the model's default (mlp 60, gpt 120) times world_size / cores when the ranks
    outnumber the cores (they take turns)."""
    seed: int = 0
    """Seed for the model, the data and every rank's RNGs."""
    batch_size: int = None  # type: ignore[assignment]
    """Samples per data-parallel rank per step (global batch = batch_size x dp ranks);
    None: the strategy's default, else 32."""
    lr: float = None  # type: ignore[assignment]
    """Learning rate of the optimizer; None: the strategy's or the model's default (mlp 0.05)."""
    optimizer: str = None  # type: ignore[assignment]
    """sgd, momentum (SGD, momentum 0.9), adam, lars or lamb (layer-wise, for large batches);
    None: the strategy's or the model's default (mlp: sgd, gpt: adam)."""
    model: ModelConfig = None  # type: ignore[assignment]
    """The model and its shape: a ModelConfig (used as given), a kind ("mlp", "gpt",
    "digits") or a dict of ModelConfig fields (the fields not given take the strategy's
    default shape for that kind, else ModelConfig's); None: "mlp"."""
    options: Any = None
    """Strategy options (the strategy's own dataclass, or a dict of its fields)."""
    trace: bool = True
    """Record the per-rank timeline (turn off only to measure tracing overhead)."""
    check_reference: bool = False
    """Also train one process on the global batch and report the max abs weight difference."""
    inject_fault: FaultSpec | str | dict[str, Any] | None = None
    """Fail a rank on purpose, e.g. "1:3:raise" (rank 1, step 3, raise an exception), or the
    same as ``{"rank": 1, "step": 3, "kind": "raise"}``."""
    threads_per_rank: int | None = None
    """Torch threads per rank; default: CPU cores // world_size (at least 1)."""
    progress: bool | None = None
    """Show a progress bar (steps across ranks); None shows one when a run takes > 2 s."""
    nodes: int = 1
    """Emulated nodes: Linux network namespaces on this machine, one torchrun agent each,
    world_size / nodes ranks per node (see ``labkit.launchers.cluster``)."""
    link: str | None = None
    """The wire between emulated nodes: a preset such as "infiniband_hdr" (see
    ``labkit.launchers.cluster.PRESETS``) or "RATE[,LATENCY]" such as "200mbit,1ms"; None: unshaped."""
    launcher: str = "labkit"
    """Who starts the ranks: labkit (its own supervisor) or ray (Ray Train's TorchTrainer,
    ``labkit.launchers.ray``); the same rank code and the same RunResult either way."""

    def __post_init__(self) -> None:
        from labkit.config import registry
        spec = registry.lookup(self.strategy) if isinstance(self.strategy, str) else None
        problems: list[str] = self._resolve_defaults(spec)
        problems += self._field_problems()
        if spec is None:
            problems.insert(0, f"strategy {self.strategy!r} is not registered; known: "
                               f"{', '.join(registry.names())}")
        problems += self._model_problems()
        problems += self._backend_problems()
        sizes_ok = is_int(self.world_size) and is_int(self.steps)
        if self.launcher == "ray" and self.nodes != 1:
            problems.append(f"launcher 'ray' starts every rank on this machine's Ray; emulated "
                            f"nodes ({self.nodes}) need launcher 'labkit' (the default)")
        if self.nodes != 1 or self.link is not None:
            from labkit.config.cluster import config_problems

            problems += config_problems(self)
        fault = self.inject_fault
        if isinstance(fault, str):
            try:
                object.__setattr__(self, "inject_fault", FaultSpec.parse(fault))
            except ConfigError as err:
                problems += err.problems
        elif isinstance(fault, dict):
            try:
                object.__setattr__(self, "inject_fault", FaultSpec(**fault))
            except TypeError:
                problems.append(f"inject_fault {fault!r} must have exactly the keys rank, step "
                                f"and kind; e.g. {{'rank': 1, 'step': 3, 'kind': 'raise'}}")
            except ConfigError as err:
                problems += err.problems
        elif fault is not None and not isinstance(fault, FaultSpec):
            problems.append(f"inject_fault {fault!r} must be 'RANK:STEP:KIND' (e.g. '1:3:raise'), "
                            f"a FaultSpec or a dict with rank, step and kind")
        if isinstance(self.inject_fault, FaultSpec) and sizes_ok:
            problems += self._fault_problems(self.inject_fault)
        if spec is not None and sizes_ok:
            problems += self._options_problems(spec)
            if not problems and spec.check is not None:
                problems += spec.check(self)
        if problems:
            raise ConfigError(problems)

    # ---- defaults that depend on other fields ---------------------------------------------
    def _resolve_defaults(self, spec: Any) -> list[str]:
        """Fill the None fields: the model from a kind or a dict, then steps / lr /
        optimizer (explicit > strategy default > model default), then the world size
        (the strategy's, e.g. a hybrid run's dp x pp x tp, else 2)."""
        problems: list[str] = []
        model: Any = "mlp" if self.model is None else self.model
        if isinstance(model, str):
            model = {"kind": model}
        if isinstance(model, dict):
            known = [f.name for f in dataclasses.fields(ModelConfig)]
            unknown = sorted(set(model) - set(known), key=str)
            kind = model.get("kind", "mlp") if not unknown else "mlp"
            shape = (spec.defaults.get("model", {}) if spec is not None else {}).get(
                kind if isinstance(kind, str) else "mlp", {})
            if callable(shape):  # a shape that depends on what was given (e.g. in_dim = width)
                shape = shape(model)
            if unknown:
                problems.append(f"model has unknown key(s) {', '.join(map(str, unknown))}; "
                                f"known: {', '.join(known)}; e.g. model={{'kind': 'gpt', "
                                f"'width': 256}}")
                model = ModelConfig()
            else:
                model = ModelConfig(**{**shape, **model})
        elif not isinstance(model, ModelConfig):
            problems.append(f"model ({model!r}) must be a ModelConfig, a kind "
                            f"({', '.join(MODELS)}) or a dict of its fields, not "
                            f"{type(model).__name__}; e.g. model={{'kind': 'gpt', 'width': 256}}")
            model = ModelConfig()
        object.__setattr__(self, "model", model)
        defaults = {**MODEL_DEFAULTS.get(model.kind, MODEL_DEFAULTS["mlp"]),
                    **(spec.defaults if spec is not None else {})}
        for name in ("steps", "lr", "optimizer", "batch_size"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, defaults.get(name, 32))
        if self.world_size is None:
            size = 2
            if spec is not None and spec.default_world_size is not None \
                    and not self._options_problems(spec):
                size = spec.default_world_size(self.options)
            object.__setattr__(self, "world_size", size)
        if self.timeout_s is None:
            share = max(1.0, self.world_size / devices.cpu_count()) \
                if isinstance(self.world_size, int) else 1.0
            # capped: a world size too large for any machine is world_size's rule to name,
            # not a timeout the user never set
            object.__setattr__(self, "timeout_s", min(defaults["timeout_s"] * share, MAX_TIMEOUT_S))
        return problems

    # ---- rules ---------------------------------------------------------------------------
    def _field_problems(self) -> list[str]:
        """Each field's own type and range (numpy scalars become Python numbers first)."""
        for name in ("world_size", "steps", "timeout_s", "seed", "batch_size", "lr",
                     "threads_per_rank"):
            object.__setattr__(self, name, as_plain(getattr(self, name)))
        checks = [
            int_problem("world_size", self.world_size, 1, example=2),
            int_problem("steps", self.steps, 1, MAX_STEPS, example=10,
                        why=" (the timeline keeps every step in memory)"),
            real_problem("timeout_s", self.timeout_s, MAX_TIMEOUT_S, unit=" seconds",
                         example=60),
            int_problem("seed", self.seed, 0, SEED_MAX, example=0,
                        why=" (what torch and numpy generators accept)"),
            int_problem("batch_size", self.batch_size, 1, MAX_BATCH, example=32,
                        why=" samples per rank"),
            real_problem("lr", self.lr, MAX_LR, example=0.05,
                         why=" (larger steps diverge with every optimizer here)"),
            choice_problem("optimizer", self.optimizer, OPTIMIZERS),
            None if self.threads_per_rank is None else int_problem(
                "threads_per_rank", self.threads_per_rank, 1, MAX_THREADS, example=1),
            bool_problem("trace", self.trace),
            bool_problem("check_reference", self.check_reference),
            bool_problem("progress", self.progress, optional=True),
            choice_problem("launcher", self.launcher, LAUNCHERS),
        ]
        return [p for p in checks if p is not None]

    def _model_problems(self) -> list[str]:
        """The model's own rules (``_resolve_defaults`` made it a ModelConfig)."""
        return self.model.problems() if isinstance(self.model, ModelConfig) else []

    def _backend_problems(self) -> list[str]:
        if not isinstance(self.backend, str) or self.backend not in BACKENDS:
            return [f"backend {self.backend!r} must be one of {', '.join(BACKENDS)}"]
        if self.backend == "nccl" and is_int(self.world_size):
            gpus = devices.gpu_count()
            if gpus < self.world_size:
                return [f"backend 'nccl' needs one GPU per rank, but world_size "
                        f"({self.world_size}) > GPUs visible ({gpus}); use backend='gloo' or "
                        f"world_size <= {max(gpus, 1)}"]
        return []

    def _fault_problems(self, f: FaultSpec) -> list[str]:
        out = []
        if f.kind not in FAULT_KINDS:
            out.append(f"inject_fault kind {f.kind!r} must be one of {', '.join(FAULT_KINDS)}")
        if not 0 <= f.rank < max(self.world_size, 1):
            out.append(f"inject_fault rank ({f.rank}) must be in 0..{self.world_size - 1}")
        if not 0 <= f.step < max(self.steps, 1):
            out.append(f"inject_fault step ({f.step}) must be in 0..{self.steps - 1}")
        return out

    def _options_problems(self, spec: Any) -> list[str]:
        if spec.options is None:
            if self.options not in (None, {}):
                return [f"strategy {self.strategy!r} takes no options, got {self.options!r}"]
            return []
        opts = self.options
        if opts is None:
            opts = {}
        if isinstance(opts, dict):
            known = {f.name for f in dataclasses.fields(spec.options)}
            unknown = sorted(set(opts) - known)
            if unknown:
                return [f"unknown option(s) {', '.join(unknown)} for strategy "
                        f"{self.strategy!r}; known: {', '.join(sorted(known))}"]
            try:
                opts = spec.options(**opts)
            except ConfigError as err:
                return err.problems
        if not isinstance(opts, spec.options):
            return [f"options for {self.strategy!r} must be {spec.options.__name__} or a dict, "
                    f"got {type(opts).__name__}"]
        object.__setattr__(self, "options", opts)
        return []

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
        return "nccl" if devices.gpu_count() >= self.world_size else "gloo"

    def threads(self) -> int:
        return self.threads_per_rank or devices.default_threads_per_rank(self.world_size)

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some fields changed (validated again)."""
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
