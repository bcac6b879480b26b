"""The parameter server's settings, metrics record and registration (``labkit.strategies.ps``).

Torch-free: discovery imports this (through the package) in the supervisor, which validates a
config and builds the CLI flags from it before any process starts; the rank code lives in the
sibling modules and is imported only inside the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, integer, one_of, option, real
from labkit.config.registry import Strategy, register
from labkit.strategies.ps.protocol import Consistency, parse_straggler

CONSISTENCIES = tuple(c.value for c in Consistency)
ELEMENTWISE_OPTIMIZERS = ("sgd", "momentum", "adam")
DEFAULT_BOUND = 2
"""The default of both ``--staleness`` (ssp, clocks) and ``--delay`` (bounded-delay, updates)."""
MAX_STRAGGLER = 100.0
STRAGGLER_FACTOR = real(1, MAX_STRAGGLER, lo_open=False, example="'3:4'",
                        why=" (how many times slower a worker computes)")


@dataclass(kw_only=True, frozen=True)
class PSOptions:
    """Settings of the parameter server run."""

    servers: int = option(1, integer(1, 64, example=1))
    """Server ranks (the first S ranks), each owning one contiguous shard of the parameters."""
    workers: int = option(0, integer(0, 64, example=3, why=" (0: every rank that is not a server)"))
    """Worker ranks (after the servers) that pull weights and push gradients; 0: every rank
    that is not a server (world_size - servers)."""
    consistency: str = option("bsp", one_of(CONSISTENCIES, example="ssp"))
    """bsp (every step waits for all workers), asp (never wait), ssp (a worker waits while it
    is more than --staleness clocks ahead of the slowest; Ho et al. 2013) or bounded-delay
    (wait while a gradient could end up more than --delay updates stale; Li et al. 2014)."""
    staleness: int | None = option(None, integer(0, 1000, example=2, optional=True,
                                                 why=" clocks"))
    """SSP's staleness s in clocks (default 2): a worker at clock c (c steps pushed) waits
    until the slowest worker is at clock c - s or later; s = 0 paces like BSP."""
    delay: int | None = option(None, integer(0, 1000, example=2, optional=True,
                                             why=" updates"))
    """Bounded delay's K in updates (default 2): no gradient is applied more than K updates
    after the version it was computed on; K = 0 runs the workers one at a time."""
    straggler: str = ""
    """Slow one worker: RANK:FACTOR makes worker rank RANK's compute FACTOR times longer (e.g. 3:4)."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if self.staleness is not None and self.consistency != "ssp":
            problems.append(f"staleness ({self.staleness}) is the bound of ssp (clocks); with "
                            f"consistency {self.consistency!r} drop it, or use "
                            f"--consistency ssp --staleness {self.staleness}")
        if self.delay is not None and self.consistency != "bounded-delay":
            problems.append(f"delay ({self.delay}) is the bound of bounded-delay (updates); "
                            f"with consistency {self.consistency!r} drop it, or use "
                            f"--consistency bounded-delay --delay {self.delay}")
        if self.straggler:
            try:
                _, factor = parse_straggler(self.straggler)
                slow = STRAGGLER_FACTOR(f"straggler factor in {self.straggler!r}", factor)
                if slow is not None:
                    problems.append(slow)
            except ValueError:
                problems.append(f"straggler {self.straggler!r} must look like RANK:FACTOR, "
                                f"e.g. --straggler 3:4 (worker rank 3 computes 4x slower)")
        if problems:
            raise ConfigError(problems)

    @property
    def bound(self) -> int:
        """The gate's bound: SSP's staleness (clocks) or bounded delay's K (updates); 0 for
        BSP, unused by ASP."""
        given = {"ssp": self.staleness, "bounded-delay": self.delay}.get(self.consistency)
        if given is not None:
            return given
        return DEFAULT_BOUND if self.consistency in ("ssp", "bounded-delay") else 0


def workers_of(config: Any) -> int:
    """Worker ranks of a ps run (``--workers``, or every rank that is not a server)."""
    opts = config.options
    return int(opts.workers or config.world_size - opts.servers)


def _check(config: Any) -> list[str]:
    opts: PSOptions = config.options
    problems = []
    s, w = opts.servers, workers_of(config)
    if w < 1 or s + w != config.world_size:
        problems.append(f"world_size ({config.world_size}) must equal servers ({s}) + workers "
                        f"({opts.workers or 'the rest'}), with at least one worker; e.g. "
                        f"`labkit run ps --servers 1 --workers 3` (world size 4)")
    if opts.straggler and not problems:
        rank, _ = parse_straggler(opts.straggler)
        if not s <= rank < config.world_size:
            servers = "rank 0 is the server" if s == 1 else f"ranks 0..{s - 1} are servers"
            problems.append(f"straggler rank ({rank}) must be a worker rank, {s}.."
                            f"{config.world_size - 1} ({servers}); e.g. "
                            f"--straggler {config.world_size - 1}:4")
    if config.optimizer not in ELEMENTWISE_OPTIMIZERS:
        problems.append(f"optimizer {config.optimizer!r} cannot run on a server's flat shard "
                        f"(it needs whole layers); use one of {', '.join(ELEMENTWISE_OPTIMIZERS)}")
    if config.backend == "nccl":
        problems.append("backend 'nccl' cannot receive from whichever worker sends first, "
                        "which a server does; use backend 'gloo' (or 'auto')")
    return problems


def _world_size(options: PSOptions) -> int:
    """The world size ``--servers`` and ``--workers`` imply when none is given: servers plus
    workers, or plus one worker when ``--workers`` is 0 (every rank that is not a server)."""
    return options.servers + (options.workers or 1)


register(Strategy(
    name="ps", entry="labkit.strategies.ps.impl:train", options=PSOptions,
    summary="parameter server: workers push gradients to and pull shards from server ranks; "
            "BSP / ASP / SSP (clocks) / bounded delay (updates)", check=_check, lesson="11_async_training",
    default_world_size=_world_size, backends=("gloo",)))
