"""A rank's process group, held open across jobs, and one job run inside it.

A fresh rank (the supervisor's, torchrun's: ``labkit.rank.context.run_rank``) opens its group, runs
one job and closes it; a warm pool rank (``labkit.launchers.pool_main``) opens it once and runs job
after job. Both run a job through ``RankGroup.run``, so the job sees the same rank either
way and produces the same bits:

1. every random generator reset to the job's seed (torch ``seed * 1000 + rank``, Python's
   ``random`` and numpy's global generator from the same number), torch's thread count set,
   gradients on, fp32 the default dtype -- whatever the previous job changed; the rank
   pinned to cores of its own where they allow (``labkit.rank.pinning``), again per job;
2. a fresh tracer and ``Comm``; the grid's sub-groups are made once per grid and reused.
   ``new_subgroups_by_enumeration`` is collective: every rank must create every group of an
   axis, in the same order. Pool ranks run the same jobs in the same order, so their caches
   hit and miss together;
3. clocks aligned at a barrier, per job (time zero is this job's start);
4. the strategy or the student's function; every async op drained; the events handed back.
"""

from __future__ import annotations

import importlib
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from labkit.rank.context import RankContext, RunContext
from labkit.rank.job import Job, LaunchJob, RankReport, RunJob
from labkit.rank.pinning import pin_rank
from labkit.rank.subgroups import build_axis_comms

if TYPE_CHECKING:
    from labkit.trace.tracer import Tracer


def load_entry(entry: str) -> Callable[..., Any]:
    """Import a strategy's rank code, "module:function" (inside the rank)."""
    module, _, func = entry.partition(":")
    return getattr(importlib.import_module(module), func)  # type: ignore[no-any-return]


def reset_rank_state(seed: int, rank: int, threads: int) -> None:
    """Step 1: the state a freshly started rank would have for this job."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(seed * 1000 + rank)
    random.seed(seed * 1000 + rank)
    np.random.seed((seed * 1000 + rank) % 2**32)
    torch.set_grad_enabled(True)
    torch.set_default_dtype(torch.float32)
    # zero and tp make their GPU the default device; on a warm pool it must not outlive the job
    torch.set_default_device(None)


@dataclass
class RankGroup:
    """This rank's place in an open process group (``open`` it, ``run`` jobs, ``close``)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any
    subgroups: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """Sub-groups made so far, by (axis, its groups): reused by later jobs on the same grid."""

    @classmethod
    def open(cls, backend: str, rank: int, world_size: int, *, timeout_s: float,
             local_rank: int | None = None, store: Any = None) -> RankGroup:
        """Join the group: ``store`` None means env:// rendezvous (torchrun sets MASTER_ADDR /
        MASTER_PORT). ``timeout_s`` bounds every collective, so a dead peer cannot block a
        rank for torch's default 30 minutes."""
        import torch.distributed as dist

        group = cls.adopt(backend, rank, world_size, local_rank=local_rank)
        kw: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world_size,
                              "timeout": timedelta(seconds=timeout_s)}
        if store is not None:
            kw["store"] = store
        else:
            kw["init_method"] = "env://"
        dist.init_process_group(**kw)
        return group

    @classmethod
    def adopt(cls, backend: str, rank: int, world_size: int, *,
              local_rank: int | None = None) -> RankGroup:
        """This rank's place in a default group someone else made and will close (Ray
        Train's): only the device is claimed."""
        import torch

        local_rank = rank if local_rank is None else local_rank
        if backend == "nccl":
            from labkit.base.devices import claim_gpu

            claim_gpu(local_rank)  # one GPU per rank; a clear error when it is missing or busy
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        return cls(rank, world_size, local_rank, backend, device)

    def close(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    def run(self, job: Job, *, status: Any = None, progress: Any = None,
            before_destroy: Any = None, spool_dir: str | None = None,
            ranks_per_node: int | None = None) -> RankReport:
        """Run one job in the open group (steps 1-4 of the module docstring).

        ``spool_dir`` turns on the event spool (a failed run keeps its timeline);
        ``ranks_per_node`` (torchrun's LOCAL_WORLD_SIZE) marks node boundaries;
        ``before_destroy(report)`` runs at the end, while the group is up (torchrun's worker
        gathers every rank's report to rank 0 there).
        """
        from labkit.rank.job import RankReport
        from labkit.trace.comm import Comm, spin_waits
        from labkit.trace.tracer import CudaTracer, Tracer

        reset_rank_state(job.seed, self.rank, job.threads)  # 1.
        pinning = pin_rank(self.rank, self.world_size, job.threads)
        tracer = (CudaTracer(self.rank, job.trace) if self.backend == "nccl"
                  else Tracer(self.rank, job.trace))
        grid = job.grid if isinstance(job, RunJob) else None
        active = grid.active_axes() if grid is not None else []
        comm = Comm(tracer, self.rank, self.world_size, status=status,
                    axis=active[0] if len(active) == 1 else None)
        comm.spin = spin_waits(self.backend, self.world_size)
        axis_comms = build_axis_comms(comm, grid, self.subgroups) if grid is not None else {}
        offset = align_clocks(tracer, self.rank, self.world_size)  # 3.
        spool = None
        if spool_dir is not None and job.trace and type(tracer) is Tracer:
            from labkit.trace.spool import Spool, spool_path

            spool = Spool(spool_path(spool_dir, self.rank), tracer, offset)
        common: dict[str, Any] = dict(
            rank=self.rank, world_size=self.world_size, local_rank=self.local_rank,
            backend=self.backend, device=self.device, tracer=tracer, comm=comm, seed=job.seed,
            progress=progress, spool=spool, grid=grid, axis_comms=axis_comms,
            ranks_per_node=ranks_per_node)
        try:  # 4.
            if isinstance(job, RunJob):
                output = load_entry(job.entry)(RunContext(**common, config=job.config,
                                                          fault=job.config.inject_fault))
            else:
                assert isinstance(job, LaunchJob), f"a job is a RunJob or a LaunchJob: {job!r}"
                output = job.fn(RankContext(**common), *job.args)
        except BaseException:
            if spool is not None:  # everything up to the error, for err.timeline
                spool.write()
            raise
        comm.drain()  # every async op's span recorded before the events are handed in
        report = RankReport(rank=self.rank, host=socket.gethostname(),
                            events=tracer.events(offset), output=output, pinning=pinning)
        if before_destroy is not None:
            before_destroy(report)
        return report




def align_clocks(tracer: Tracer, rank: int, world_size: int) -> int:
    """Agree on time zero: right after a barrier, rank 0's clock reading.

    Ranks on rank 0's host share its monotonic clock, so their offsets are exact. Ranks on
    other hosts cannot read that clock; they assume they left the barrier at the same
    instant as rank 0 (error: the barrier's skew, typically tens of microseconds).
    Returns the offset (ns) to add to this rank's local times.
    """
    import torch.distributed as dist

    dist.barrier()
    tracer.align()
    mine = (socket.gethostname(), int(tracer.origin_ns))
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    host0, t0 = gathered[0]
    if mine[0] == host0:
        return int(mine[1] - t0)
    return 0



def limit_threads(threads: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)


def run_rank(job: Job, rank: int, world_size: int, *, local_rank: int | None = None,
             store: Any = None, status: Any = None, progress: Any = None,
             before_destroy: Any = None, spool_dir: str | None = None,
             ranks_per_node: int | None = None, existing_group: bool = False) -> RankReport:
    """Set up this rank, run the job, and return its report (the process group is destroyed).

    ``store`` None means env:// rendezvous (torchrun sets MASTER_ADDR / MASTER_PORT).
    ``spool_dir`` (the supervisor's run directory) turns on the event spool.
    ``before_destroy(report)`` runs while the group is still up (torchrun's worker gathers
    every rank's report to rank 0 there). ``ranks_per_node`` (torchrun's LOCAL_WORLD_SIZE)
    tells hierarchical collectives where the node boundaries are. ``existing_group``: the
    launcher already made the default process group through its own env:// rendezvous (Ray
    Train's ``TorchConfig``); the rank uses it and leaves its teardown to the launcher. A
    warm pool rank runs its jobs the same way (``labkit.rank.group``), keeping the group open
    between them.
    """
    limit_threads(job.threads)
    group = (RankGroup.adopt(job.backend, rank, world_size, local_rank=local_rank)
             if existing_group else
             RankGroup.open(job.backend, rank, world_size, timeout_s=job.timeout_s + 30,
                            local_rank=local_rank, store=store))
    try:
        return group.run(job, status=status, progress=progress, before_destroy=before_destroy,
                         spool_dir=spool_dir, ranks_per_node=ranks_per_node)
    finally:
        if not existing_group:
            group.close()
