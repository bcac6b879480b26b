"""The limits and rules of a run's settings, stated once for every way of starting ranks.

``RunConfig`` (``labkit.run``) and ``labkit.launch`` both start processes with a timeout, a
seed, a thread count and a tracing switch: ``settings_problems`` is their one rule for
those. ``FaultSpec`` is the fault a lesson or test injects on purpose (``RANK:STEP:KIND``).
Every message names the value, the rule and a valid example (``labkit.base.validate``).
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base import devices
from labkit.base.errors import ConfigError
from labkit.base.validate import bool_problem, int_problem, is_int, real_problem

BACKENDS = ("auto", "gloo", "nccl")
FAULT_KINDS = ("raise", "exit", "kill", "hang")
OPTIMIZERS = ("sgd", "momentum", "adam", "lars", "lamb")
LAUNCHERS = ("labkit", "ray")
MAX_STEPS = 100_000  # the timeline keeps every step's spans in memory
MAX_BATCH = 65_536  # samples per rank per step
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # one week; gloo's own timeout is derived from it
MAX_LR = 100.0  # a larger step diverges with every optimizer here
SEED_MAX = 2**32 - 1  # what numpy and torch generators both accept (torch seeds derive from it)
MAX_THREADS = 256


def settings_problems(*, timeout_s: Any, seed: Any, threads_per_rank: Any,
                      trace: Any) -> list[str]:
    """The rules every start of ranks shares (``RunConfig`` and ``labkit.launch``)."""
    checks = [
        real_problem("timeout_s", timeout_s, MAX_TIMEOUT_S, unit=" seconds", example=60),
        int_problem("seed", seed, 0, SEED_MAX, example=0,
                    why=" (what torch and numpy generators accept)"),
        None if threads_per_rank is None else int_problem(
            "threads_per_rank", threads_per_rank, 1, MAX_THREADS, example=1),
        bool_problem("trace", trace),
    ]
    return [p for p in checks if p is not None]


def auto_backend(world_size: int) -> str:
    """What ``backend="auto"`` means for ``world_size`` ranks on this machine: NCCL with one GPU
    per rank when there are that many GPUs, else gloo."""
    return "nccl" if devices.gpu_count() >= world_size else "gloo"


def backend_problem(backend: Any, world_size: Any) -> str | None:
    """``backend`` is known, and NCCL has one GPU per rank."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        return f"backend {backend!r} must be one of {', '.join(BACKENDS)}"
    if backend == "nccl" and is_int(world_size):
        gpus = devices.gpu_count()
        if gpus < world_size:
            return (f"backend 'nccl' needs one GPU per rank, but world_size ({world_size}) > "
                    f"GPUs visible ({gpus}); use backend='gloo' or world_size <= {max(gpus, 1)}")
    return None


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

    @classmethod
    def given(cls, fault: object) -> tuple[FaultSpec | None, list[str]]:
        """What ``RunConfig(inject_fault=...)`` accepts -- a FaultSpec, ``"1:3:raise"``, a dict
        of its fields or None -- as a FaultSpec (or None) and the problems found."""
        if fault is None or isinstance(fault, FaultSpec):
            return fault, []
        try:
            if isinstance(fault, str):
                return cls.parse(fault), []
            if isinstance(fault, dict):
                return cls(**fault), []
        except TypeError:
            return None, [f"inject_fault {fault!r} must have exactly the keys rank, step and "
                          f"kind; e.g. {{'rank': 1, 'step': 3, 'kind': 'raise'}}"]
        except ConfigError as err:
            return None, err.problems
        return None, [f"inject_fault {fault!r} must be 'RANK:STEP:KIND' (e.g. '1:3:raise'), "
                      f"a FaultSpec or a dict with rank, step and kind"]

    def __post_init__(self) -> None:
        problems = [p for p in (
            int_problem("inject_fault rank", self.rank, 0, example=1),
            int_problem("inject_fault step", self.step, 0, example=3),
            None if isinstance(self.kind, str) else
            f"inject_fault kind ({self.kind!r}) must be one of {', '.join(FAULT_KINDS)}")
            if p is not None]
        if problems:
            raise ConfigError(problems)

    def problems(self, world_size: int, steps: int) -> list[str]:
        """The rules of a fault in a run of ``world_size`` ranks and ``steps`` steps."""
        out = []
        if self.kind not in FAULT_KINDS:
            out.append(f"inject_fault kind {self.kind!r} must be one of {', '.join(FAULT_KINDS)}")
        if not 0 <= self.rank < max(world_size, 1):
            out.append(f"inject_fault rank ({self.rank}) must be in 0..{world_size - 1}")
        if not 0 <= self.step < max(steps, 1):
            out.append(f"inject_fault step ({self.step}) must be in 0..{steps - 1}")
        return out

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"
