"""The torchrun entry point: the same strategies on one host or many, under ``torchrun``.

``labkit run`` starts its own ranks (the supervisor, a file-store rendezvous). On a cluster
the launcher is PyTorch's elastic agent instead, one agent per node, meeting through the
c10d rendezvous (https://pytorch.org/docs/stable/elastic/run.html)::

    torchrun --standalone --nproc-per-node 2 -m labkit.worker run ddp --steps 20 --json
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 -m labkit.worker run ddp --json --trace run.json

Each process torchrun starts runs the SAME rank code as ``labkit run`` (``labkit.rank.
run_rank``), with an env:// rendezvous (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT
come from torchrun). The steps:

1. read the torchrun environment and build the ``RunConfig`` from the same flags as
   ``labkit run`` (argument definitions are shared with ``labkit.cli``), validated before
   the process group starts; the backend and torch threads are chosen per *node*
   (``auto`` picks NCCL when this node has one GPU per local rank);
2. arm a watchdog: there is no supervisor here, so a rank that outlives ``--timeout``
   prints its Python stack and exits instead of hanging the job;
3. train, then, while the process group is still up, gather every rank's events and
   outputs to rank 0 (``torch.distributed.gather_object``);
4. rank 0 merges them into one ``Timeline`` (clocks aligned at a barrier: exact for ranks
   on rank 0's host, barrier-aligned for other hosts), prints what ``labkit run`` prints
   (``--json``: the same object, plus ``launcher`` and a ``ranks`` table saying which node
   each rank ran on) and writes the trace. Other ranks print nothing on success.

Exit codes follow ``labkit run``: 0 ok, 1 this rank failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from labkit import devices
from labkit.config import RunConfig
from labkit.errors import ConfigError, RankFailure
from labkit.runflags import (
    add_run_flags,
    config_from_args,
    fail_input,
    fail_run,
    output_problems,
    report,
)

_EXAMPLE = "torchrun --standalone --nproc-per-node 2 -m labkit.worker run ddp"


@dataclass(frozen=True)
class TorchrunEnv:
    """Where this process sits in the job, as torchrun's environment says."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    """torchrun's GROUP_RANK: which agent (node) started this process."""

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> TorchrunEnv:
        env = dict(os.environ if environ is None else environ)
        needed = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        missing = [k for k in needed if k not in env]
        if missing:
            raise ConfigError(f"labkit.worker must be started by torchrun ({', '.join(missing)} "
                              f"not set); e.g. `{_EXAMPLE}`; on one host without torchrun use "
                              f"`labkit run ddp`")
        world = int(env["WORLD_SIZE"])
        return cls(rank=int(env["RANK"]), world_size=world, local_rank=int(env["LOCAL_RANK"]),
                   local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
                   node_rank=int(env.get("GROUP_RANK", 0)))


def resolve_backend(requested: str, local_world_size: int) -> str:
    """The backend for a torchrun job: GPUs are counted on THIS node, one per local rank.

    ``auto`` picks nccl when this node sees at least ``local_world_size`` GPUs (after
    CUDA_VISIBLE_DEVICES), gloo otherwise; ``nccl`` with too few GPUs is a ``ConfigError``.
    """
    if requested == "gloo":
        return "gloo"
    gpus = devices.gpu_count()
    if requested == "auto":
        return "nccl" if gpus >= local_world_size >= 1 else "gloo"
    if requested == "nccl" and gpus < local_world_size:
        raise ConfigError(f"backend 'nccl' needs one GPU per local rank, but --nproc-per-node "
                          f"({local_world_size}) > GPUs visible on {socket.gethostname()} "
                          f"({gpus}, CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); use "
                          f"--backend gloo or --nproc-per-node {max(gpus, 1)}")
    return requested


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m labkit.worker",
                                     description="Run a labkit strategy under torchrun.",
                                     epilog=f"example: {_EXAMPLE} --json")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_run_flags(sub.add_parser("run", help="train a strategy on torchrun's ranks"))
    return parser


def torchrun_config(args: argparse.Namespace, extra: list[str], env: TorchrunEnv,
                    world_size_given: bool) -> RunConfig:
    """The ``RunConfig`` ``labkit run`` would build from the same flags (world size: torchrun's)."""
    if world_size_given and args.world_size != env.world_size:
        raise ConfigError(f"--world-size ({args.world_size}) must equal torchrun's WORLD_SIZE "
                          f"({env.world_size} = nnodes x nproc-per-node); drop --world-size")
    if args.backend == "nccl" and env.world_size > env.local_world_size:
        args.backend = "auto"  # RunConfig counts GPUs as if all ranks were local;
        # resolve_backend checks this node's GPUs against its own ranks instead
    args.progress = False
    return config_from_args(args, extra, command="labkit.worker run", world_size=env.world_size)


def _arm_watchdog(timeout_s: float, rank: int) -> threading.Timer:
    """Stop this rank with its stack if it outlives the run's timeout (no supervisor here)."""
    def fire() -> None:
        sys.stderr.write(f"labkit.worker: rank {rank} still running after --timeout "
                         f"{timeout_s:g} s; its stack:\n")
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    # a backstop that fires even if a C call holds the GIL
    faulthandler.dump_traceback_later(timeout_s + 10, exit=True)
    return timer


def _rank_row(report: Any, env: TorchrunEnv) -> dict[str, Any]:
    return {"rank": env.rank, "local_rank": env.local_rank, "node_rank": env.node_rank,
            "host": report.host, "pid": os.getpid(), "events": len(report.events)}


def run_under_torchrun(args: argparse.Namespace, config: RunConfig, env: TorchrunEnv,
                       backend: str, t0: float) -> int:
    """Phases 2-4 of the module docstring; returns the exit code."""
    import torch.distributed as dist

    from labkit.rank import run_rank, torchrun_store
    from labkit.runner import collect, job_for

    threads = config.threads_per_rank or devices.default_threads_per_rank(env.local_world_size)
    job = job_for(config, backend, threads)
    gathered: list[Any] = []

    def gather_to_rank0(report: Any) -> None:
        # 3. every rank's report (events + output) travels to rank 0 before the group ends
        out: list[Any] | None = [None] * env.world_size if env.rank == 0 else None
        dist.gather_object((report, _rank_row(report, env)), out, dst=0)
        gathered.extend(out or [])

    timer = _arm_watchdog(config.timeout_s, env.rank)  # 2.
    try:
        run_rank(job, env.rank, env.world_size, local_rank=env.local_rank,
                 store=torchrun_store(env.rank, env.world_size),
                 before_destroy=gather_to_rank0)
    except Exception as exc:  # noqa: BLE001 - reported the way labkit run reports a rank failure
        return fail_run(args, RankFailure(env.rank, "exception", f"{type(exc).__name__}: "
                                          f"{exc}", traceback.format_exc()))
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
    if env.rank != 0:
        return 0
    # 4. rank 0 merges the timelines and prints what `labkit run` prints
    result = collect(config, backend, [r for r, _ in gathered], time.monotonic() - t0)
    rows = [row for _, row in gathered]
    host0 = rows[0]["host"]
    for row in rows:
        row["clock"] = "same host as rank 0" if row["host"] == host0 else "barrier-aligned"
    return report(args, result, {"launcher": "torchrun",
                                 "nnodes": len({r["node_rank"] for r in rows}), "ranks": rows})


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command != "run":
        parser.print_help(sys.stderr)
        return 2
    try:
        env = TorchrunEnv.from_environ()
    except ConfigError as err:
        return fail_input(args, str(err))
    from labkit.rank import _die_with_parent

    _die_with_parent()  # if the torchrun agent dies, this worker goes with it
    try:
        # 1. flags -> validated config; backend and threads chosen for this node
        config = torchrun_config(args, extra, env,
                                 any(a.startswith("--world-size") for a in argv))
        backend = resolve_backend(args.backend, env.local_world_size)
        problems = output_problems(args) if env.rank == 0 else []  # rank 0 writes them
        if problems:
            raise ConfigError(problems)
    except ConfigError as err:
        # every rank rejects the same flags: rank 0 speaks for all of them
        return fail_input(args, str(err)) if env.rank == 0 else 2
    return run_under_torchrun(args, config, env, backend, t0)


if __name__ == "__main__":
    sys.exit(main())
