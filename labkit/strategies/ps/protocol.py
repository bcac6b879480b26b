"""The parameter server's rules, as pure Python: who may read the weights, and when.

A parameter server (Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter
Server", OSDI) keeps the weights; workers *pull* them, compute a gradient on their own data
and *push* it back. Each applied update moves the server's ``version`` on by one. The
*staleness* of a gradient is the version it is applied at minus the version it was computed
on: how many other updates slipped in between the worker's pull and its push.

The consistency model is the rule that decides when a pull is answered (``Gate``). A
worker's *clock* is the number of steps it has pushed: the pull for its step c is made at
clock c.

* **BSP** (bulk synchronous parallel): the pull for step ``t`` waits until the update of
  step ``t - 1`` is applied, and that update waits for every worker's gradient of step
  ``t - 1`` (their mean is applied once). Staleness is always 0; this is synchronous data
  parallelism with the all-reduce replaced by a server.
* **ASP** (asynchronous parallel; Hogwild-style, Recht et al. 2011; Dean et al. 2012): a pull
  is answered at once and every gradient is applied the moment it arrives. Nobody waits for a
  slow worker; its gradients arrive stale.
* **SSP** with staleness ``s`` (stale synchronous parallel; Ho et al. 2013, "More Effective
  Distributed ML via a Stale Synchronous Parallel Parameter Server", NIPS): a worker at
  clock ``c`` may proceed only while the slowest worker's clock is ``>= c - s``, so no two
  workers drift more than ``s`` clocks apart. Gradients are applied as they arrive (as
  ASP), so the read at clock ``c`` holds every update of clocks ``< c - s`` and the worker's
  own. ``s = 0`` paces exactly like BSP (every worker waits for the slowest at every
  step); a large ``s`` behaves like ASP.
* **Bounded delay** with bound ``K`` (Li et al. 2014, "Flexible Consistency": a new task
  waits until every task issued more than tau tasks earlier has finished; tau = 0 is
  sequential consistency, tau = infinity eventual consistency): labkit bounds the delay of
  each gradient in *updates* -- a pull is answered only if no gradient then in flight can
  end up more than ``K`` updates stale::

      reads in flight R (pulled, not yet pushed), each read at version v_w.
      Until w pushes, at most |R| - 1 other gradients can be applied, so w's gradient will
      be at most (V - v_w) + |R| - 1 stale. Grant a new read only if, with it added,
      (V - v_w) + |R| - 1 <= K for every w in R.

  So ``max_staleness <= K`` by construction, and ``K = 0`` runs the workers *one at a
  time*; the clock gap is not bounded (a fast worker can lap a slow one). A push applies at
  once, which keeps the sum above unchanged for the others; a worker whose pull is refused
  waits only for workers that are computing, never for one that is itself waiting: no
  deadlock. (Before issue 25 this rule was labkit's "ssp"; Ho et al.'s SSP bounds clocks.)

Either way a run reports both quantities: the staleness of every gradient in updates and
the *clock gap* at every read (the reader's clock minus the slowest worker's).

Every worker pulls from servers in the same order (server 0 first), so with several servers
a worker holding a read on server 0 is never waited on by one holding a read on server 1.

Torch-free: the unit tests drive the gate with simulated workers.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class Consistency(enum.Enum):
    BSP = "bsp"
    ASP = "asp"
    SSP = "ssp"
    """Ho et al. 2013: clocks at most ``s`` apart."""
    DELAY = "bounded-delay"
    """Li et al. 2014: no gradient more than ``K`` updates stale."""


class Kind(enum.IntEnum):
    """What a worker's request asks the server (the first field of the request header)."""

    PULL = 1
    PUSH = 2
    DONE = 3
    PUSH_PULL = 4
    """A push that also asks for the weights of the next step (one request instead of two)."""


HEADER_FIELDS = ("kind", "step", "read_version", "loss")
"""A worker's request header, float64: what, at which step, on which version, its loss."""

TAG_REQUEST = 11
"""Requests (headers) from workers to a server; the server receives them from any worker."""
TAG_GRAD = 12
"""A pushed gradient, right after its PUSH header, from that worker only."""
TAG_PARAMS = 13
"""A server's answer to a pull: [version, shard...]."""
TAG_FINAL = 14
"""A server's final shard, sent to server 0 for the hash."""


def shard_bounds(numel: int, servers: int, server: int) -> tuple[int, int]:
    """[lo, hi) of the flat parameter vector that ``server`` owns: contiguous, sizes differing
    by at most one element."""
    base, extra = divmod(numel, servers)
    lo = server * base + min(server, extra)
    return lo, lo + base + (1 if server < extra else 0)


@dataclass
class Gate:
    """One server's consistency rule: answers pulls, counts versions and staleness.

    The server calls ``request`` for every pull and sends params to the workers ``grants``
    returns; ``pushed`` for every gradient (its staleness), then ``apply_now`` says whether
    to update (BSP waits for the whole round) and ``applied`` moves the version on.
    """

    consistency: Consistency
    workers: int
    bound: int = 0
    """SSP's staleness s (clocks) or bounded delay's K (updates); unused by BSP and ASP."""
    version: int = 0
    """Updates applied so far."""
    clocks: list[int] = field(default_factory=list)
    """Per worker, the steps it has pushed: its clock."""
    clock_gaps: list[int] = field(default_factory=list)
    """At every answered pull: the reader's clock minus the slowest worker's."""
    reads: dict[int, int] = field(default_factory=dict)
    """Worker -> version it pulled, for gradients not pushed yet."""
    waiting: deque[tuple[int, int]] = field(default_factory=deque)
    """Pulls not answered yet: (worker, step), oldest first."""
    buffered: int = 0
    """BSP: gradients of the current round received so far."""
    done: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.clocks:
            self.clocks = [0] * self.workers

    # ---- pulls -----------------------------------------------------------------------------
    def request(self, worker: int, step: int) -> None:
        if worker in self.reads:
            raise ValueError(f"worker {worker} pulled again before pushing its gradient")
        self.waiting.append((worker, step))

    def may_read(self, step: int) -> bool:
        """Whether a pull for ``step`` may be answered now (rule of the module docstring)."""
        if self.consistency is Consistency.BSP:
            return self.version >= step
        if self.consistency is Consistency.ASP:
            return True
        if self.consistency is Consistency.SSP:  # at clock `step`: slowest >= step - s
            return min(self.clocks) >= step - self.bound
        in_flight = len(self.reads) + 1  # with the new read
        oldest = min(self.reads.values(), default=self.version)
        return (self.version - oldest) + in_flight - 1 <= self.bound

    def grants(self) -> list[tuple[int, int, int]]:
        """Answer every waiting pull the rule allows now, oldest first:
        [(worker, step, version read)]. A refused pull does not block the ones behind it
        (under BSP a fast worker's pull for the next step must not hold back a slow
        worker's pull for this one)."""
        out, still = [], deque[tuple[int, int]]()
        for worker, step in self.waiting:
            if self.may_read(step):
                self.reads[worker] = self.version
                self.clock_gaps.append(step - min(self.clocks))
                out.append((worker, step, self.version))
            else:
                still.append((worker, step))
        self.waiting = still
        return out

    # ---- pushes ----------------------------------------------------------------------------
    def pushed(self, worker: int, read_version: int) -> int:
        """A gradient arrived; returns its staleness (version now minus version read)."""
        pulled = self.reads.pop(worker, None)
        if pulled != read_version:
            raise ValueError(f"worker {worker} pushed a gradient of version {read_version} "
                             f"but its last answered pull was version {pulled}")
        if self.consistency is Consistency.BSP:
            self.buffered += 1
        self.clocks[worker] += 1
        return self.version - read_version

    def apply_now(self) -> bool:
        """Whether the gradients received so far make an update now."""
        if self.consistency is Consistency.BSP:
            return self.buffered == self.workers
        return True

    def applied(self) -> None:
        self.version += 1
        self.buffered = 0

    # ---- the end ----------------------------------------------------------------------------
    def finished(self, worker: int) -> None:
        self.done.add(worker)

    @property
    def all_done(self) -> bool:
        return len(self.done) == self.workers and not self.waiting and not self.reads


def parse_straggler(text: str) -> tuple[int, float]:
    """``"2:4"`` -> (rank 2, factor 4.0). Raises ValueError on anything else."""
    rank, sep, factor = text.partition(":")
    if not sep:
        raise ValueError(text)
    return int(rank), float(factor)
