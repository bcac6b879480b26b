"""Run configuration: what to run, on how many ranks, for how long — validated up front.

Every field carries a docstring line with its unit. ``__post_init__`` checks every rule and
raises one ``ConfigError`` naming *all* offending values, before any process starts.
Strategy-specific settings live in the strategy's own options dataclass
(``RunConfig.options``), registered with ``labkit.strategies``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from labkit import devices
from labkit.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")
FAULT_KINDS = ("raise", "exit", "kill", "hang")
OPTIMIZERS = ("sgd", "momentum", "adam", "lars", "lamb")


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
            return cls(rank=int(rank), step=int(step), kind=kind)
        except ValueError:
            raise ConfigError(f"inject_fault {text!r} must look like RANK:STEP:KIND with KIND one "
                              f"of {', '.join(FAULT_KINDS)}; e.g. '1:3:raise'") from None

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"


@dataclass(kw_only=True, frozen=True)
class ModelConfig:
    """The seeded synthetic MLP most strategies train (Linear+ReLU blocks)."""

    in_dim: int = 32
    """Input features per sample."""
    width: int = 128
    """Hidden units per layer."""
    depth: int = 4
    """Number of hidden Linear+ReLU blocks."""
    out_dim: int = 10
    """Classes of the synthetic classification task."""

    def problems(self) -> list[str]:
        return [f"model.{name} ({getattr(self, name)}) must be >= 1"
                for name in ("in_dim", "width", "depth", "out_dim") if getattr(self, name) < 1]


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """One multi-process run: ``labkit.run(RunConfig(strategy="ddp", world_size=2))``."""

    strategy: str
    """Registered strategy name, e.g. "ddp" (see ``labkit.strategies.names()``)."""
    world_size: int = 2
    """Number of ranks (processes) to start."""
    steps: int = 10
    """Training steps (optimizer updates)."""
    backend: str = "auto"
    """auto (NCCL with one GPU per rank when there are enough GPUs, else gloo), gloo or nccl."""
    timeout_s: float = 60.0
    """Seconds the whole run may take before it is stopped and the hung ranks are named."""
    seed: int = 0
    """Seed for the model, the data and every rank's RNGs."""
    batch_size: int = 32
    """Samples per data-parallel rank per step (global batch = batch_size x dp ranks)."""
    lr: float = 0.05
    """Learning rate of the optimizer."""
    optimizer: str = "sgd"
    """sgd, momentum (SGD, momentum 0.9), adam, lars or lamb (layer-wise, for large batches)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The synthetic model's shape."""
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
    world_size / nodes ranks per node (see ``labkit.cluster``)."""
    link: str | None = None
    """The wire between emulated nodes: a preset such as "infiniband_hdr" (see
    ``labkit.cluster.PRESETS``) or "RATE[,LATENCY]" such as "200mbit,1ms"; None: unshaped."""

    def __post_init__(self) -> None:
        from labkit import strategies

        problems: list[str] = []
        spec = strategies.lookup(self.strategy)
        if spec is None:
            problems.append(f"strategy {self.strategy!r} is not registered; known: "
                            f"{', '.join(strategies.names())}")
        if self.world_size < 1:
            problems.append(f"world_size ({self.world_size}) must be >= 1")
        if self.steps < 1:
            problems.append(f"steps ({self.steps}) must be >= 1")
        if not self.timeout_s > 0:
            problems.append(f"timeout_s ({self.timeout_s}) must be > 0 seconds, e.g. 60")
        if self.batch_size < 1:
            problems.append(f"batch_size ({self.batch_size}) must be >= 1")
        if not self.lr > 0:
            problems.append(f"lr ({self.lr}) must be > 0")
        if self.optimizer not in OPTIMIZERS:
            problems.append(f"optimizer {self.optimizer!r} must be one of {', '.join(OPTIMIZERS)}")
        if self.threads_per_rank is not None and self.threads_per_rank < 1:
            problems.append(f"threads_per_rank ({self.threads_per_rank}) must be >= 1")
        problems += self.model.problems()
        problems += self._backend_problems()
        if self.nodes != 1 or self.link is not None:
            from labkit.cluster.rules import config_problems

            problems += config_problems(self)
        fault = self.inject_fault
        if isinstance(fault, str):
            object.__setattr__(self, "inject_fault", FaultSpec.parse(fault))
        elif isinstance(fault, dict):
            try:
                object.__setattr__(self, "inject_fault", FaultSpec(**fault))
            except TypeError:
                problems.append(f"inject_fault {fault!r} must have exactly the keys rank, step "
                                f"and kind; e.g. {{'rank': 1, 'step': 3, 'kind': 'raise'}}")
        elif fault is not None and not isinstance(fault, FaultSpec):
            problems.append(f"inject_fault {fault!r} must be 'RANK:STEP:KIND' (e.g. '1:3:raise'), "
                            f"a FaultSpec or a dict with rank, step and kind")
        if isinstance(self.inject_fault, FaultSpec):
            problems += self._fault_problems(self.inject_fault)
        if spec is not None:
            problems += self._options_problems(spec)
            if not problems and spec.check is not None:
                problems += spec.check(self)
        if problems:
            raise ConfigError(problems)

    # ---- rules ---------------------------------------------------------------------------
    def _backend_problems(self) -> list[str]:
        if self.backend not in BACKENDS:
            return [f"backend {self.backend!r} must be one of {', '.join(BACKENDS)}"]
        if self.backend == "nccl" and self.world_size >= 1:
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
            return "gloo"  # emulated nodes talk over a shaped TCP link (labkit.cluster)
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
