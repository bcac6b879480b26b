"""The torchrun entry point: the same strategies on one host or many, under ``torchrun``.

``labkit run`` starts its own ranks (the supervisor, a file-store rendezvous). On a cluster
the launcher is PyTorch's elastic agent instead, one agent per node, meeting through the
c10d rendezvous (https://pytorch.org/docs/stable/elastic/run.html)::

    torchrun --standalone --nproc-per-node 2 -m labkit.worker run ddp --steps 20 --json
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 -m labkit.worker run ddp --json --trace run.json

Each process torchrun starts runs the SAME rank code as ``labkit run`` (``labkit.rank.context.
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

Three flags exist for launchers that start the worker for you (labkit's emulated cluster,
``labkit.launchers.cluster``): ``--config FILE`` (the ``RunConfig`` as JSON, instead of the flags;
a list of configs runs one after the other in the same processes, each with its own
process group, saving the start-up of a torchrun job per run),
``--rank-logs DIR`` (each rank writes its output to ``DIR/rank-<rank>.log``, its stack to
``DIR/stack-<rank>.txt`` on SIGUSR1, its events to ``DIR/spool-<job>/`` as it goes, and its
step and in-communication flag to the status board ``DIR/board`` when the launcher made
one, as the supervisor's ranks do) and
``--save-result FILE`` (rank 0 pickles the list of ``RunResult``).
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
from typing import Any, NoReturn

from labkit.base import devices
from labkit.base.errors import ConfigError, RankFailure
from labkit.base.files import write_atomic
from labkit.config.flags import add_run_flags, config_from_args
from labkit.config.run import RunConfig
from labkit.launchers.output import fail_input, fail_run, output_problems, report

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
    run = sub.add_parser("run", help="train a strategy on torchrun's ranks")
    add_run_flags(run)
    run.add_argument("--config", default=None, metavar="FILE",
                     help="read the RunConfig from this JSON file (RunConfig.to_json()) "
                          "instead of the flags; a list of them runs one after the other")
    run.add_argument("--rank-logs", default=None, metavar="DIR",
                     help="each rank writes its output to DIR/rank-RANK.log and, on SIGUSR1, "
                          "its stack to DIR/stack-RANK.txt")
    run.add_argument("--save-result", default=None, metavar="FILE",
                     help="rank 0 also pickles the list of RunResults (one per config) to FILE")
    return parser


def configs_from_file(path: str) -> list[RunConfig]:
    """The ``RunConfig`` (or list of them) a launcher wrote as ``config.to_json()``."""
    import json

    from labkit.config.run import ModelConfig

    with open(path) as f:
        data = json.load(f)
    configs = []
    for item in data if isinstance(data, list) else [data]:
        item["model"] = ModelConfig(**item.get("model", {}))
        configs.append(RunConfig(**item))
    return configs


def _rank_logs(directory: str, rank: int) -> None:
    """Send this rank's stdout and stderr to its own file, and its stack there on SIGUSR1."""
    import signal

    log = os.open(os.path.join(directory, f"rank-{rank}.log"),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    stack = open(os.path.join(directory, f"stack-{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)


def torchrun_config(args: argparse.Namespace, extra: list[str], env: TorchrunEnv,
                    world_size_given: bool) -> RunConfig:
    """The ``RunConfig`` ``labkit run`` would build from the same flags (world size: torchrun's)."""
    if args.nodes != 1 or args.link is not None:
        raise ConfigError(f"--nodes ({args.nodes}) and --link ({args.link}) are for `labkit run` "
                          f"(it emulates the nodes); under torchrun the nodes are torchrun's "
                          f"--nnodes; drop them")
    if world_size_given and args.world_size != env.world_size:
        raise ConfigError(f"--world-size ({args.world_size}) must equal torchrun's WORLD_SIZE "
                          f"({env.world_size} = nnodes x nproc-per-node); drop --world-size")
    if args.launcher != "labkit":
        raise ConfigError(f"--launcher {args.launcher} cannot run under torchrun (torchrun is "
                          f"the launcher here); drop --launcher, or use `labkit run "
                          f"{args.strategy} --launcher {args.launcher}` without torchrun")
    if args.backend == "nccl" and env.world_size > env.local_world_size:
        args.backend = "auto"  # RunConfig counts GPUs as if all ranks were local;
        # resolve_backend checks this node's GPUs against its own ranks instead
    args.progress = False
    return config_from_args(args, extra, command="labkit.worker run", world_size=env.world_size)


def torchrun_configs(args: argparse.Namespace, extra: list[str], env: TorchrunEnv,
                     world_size_given: bool) -> list[RunConfig]:
    """The runs to do, in order: the flags' one, or every config of ``--config FILE``."""
    if not args.config:
        return [torchrun_config(args, extra, env, world_size_given)]
    configs = configs_from_file(args.config)
    bad = [c.world_size for c in configs if c.world_size != env.world_size]
    if bad:
        raise ConfigError(f"world_size ({bad[0]}) in {args.config} must equal torchrun's "
                          f"WORLD_SIZE ({env.world_size})")
    return configs


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


def _board_slots(directory: str | None, env: TorchrunEnv) -> dict[str, Any]:
    """This rank's progress and in-communication slots on the launcher's status board
    (``DIR/board``, when a launcher made one), so a timeout can name the stuck rank."""
    if directory is None or not os.path.exists(os.path.join(directory, "board")):
        return {}
    from labkit.launchers.board import Board

    board = Board.open(os.path.join(directory, "board"), env.world_size)
    return {"status": board.status(env.rank), "progress": board.steps(env.rank)}


def _rank_row(report: Any, env: TorchrunEnv) -> dict[str, Any]:
    # "node": the emulated node (LABKIT_NODE, set by labkit.launchers.cluster), else torchrun's agent
    node = int(os.environ.get("LABKIT_NODE", env.node_rank))
    return {"rank": env.rank, "local_rank": env.local_rank, "node_rank": env.node_rank,
            "node": node, "host": report.host, "pid": os.getpid(), "events": len(report.events)}


def run_under_torchrun(args: argparse.Namespace, config: RunConfig, env: TorchrunEnv,
                       backend: str, t0: float, job_index: int = 0) -> tuple[int, Any]:
    """Phases 2-4 of the module docstring: (exit code, rank 0's RunResult or None)."""
    import torch.distributed as dist

    from labkit.launchers.jobs import job_for
    from labkit.launchers.results import collect
    from labkit.launchers.torchrun import torchrun_store
    from labkit.rank.group import run_rank

    threads = config.threads_per_rank or devices.default_threads_per_rank(env.local_world_size)
    job = job_for(config, backend, threads)
    gathered: list[Any] = []

    def gather_to_rank0(report: Any) -> None:
        # 3. every rank's report (events + output) travels to rank 0 before the group ends
        out: list[Any] | None = [None] * env.world_size if env.rank == 0 else None
        dist.gather_object((report, _rank_row(report, env)), out, dst=0)
        gathered.extend(out or [])

    spool_dir = None
    if args.rank_logs:  # each rank spools its events, so a failed run keeps its timeline
        spool_dir = os.path.join(args.rank_logs, f"spool-{job_index}")
        os.makedirs(spool_dir, exist_ok=True)
    timer = _arm_watchdog(config.timeout_s, env.rank)  # 2.
    try:
        run_rank(job, env.rank, env.world_size, local_rank=env.local_rank,
                 store=torchrun_store(env.rank, env.world_size, job_index),
                 before_destroy=gather_to_rank0, ranks_per_node=env.local_world_size,
                 spool_dir=spool_dir, **_board_slots(args.rank_logs, env))
    except Exception as exc:  # noqa: BLE001 - reported the way labkit run reports a rank failure
        return fail_run(args, RankFailure(env.rank, "exception", f"{type(exc).__name__}: "
                                          f"{exc}", traceback.format_exc())), None
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
    if env.rank != 0:
        return 0, None
    # 4. rank 0 merges the timelines and prints what `labkit run` prints
    result = collect(job, [r for r, _ in gathered], time.monotonic() - t0)
    rows = [row for _, row in gathered]
    host0 = rows[0]["host"]
    for row in rows:
        row["clock"] = "same host as rank 0" if row["host"] == host0 else "barrier-aligned"
    result.timeline.meta["ranks"] = rows  # which node each rank ran on, with the timeline
    return report(args, result, {"launcher": "torchrun",
                                 "nnodes": len({r["node_rank"] for r in rows}),
                                 "ranks": rows}), result


def _save_results(path: str, results: list[Any]) -> None:
    import pickle

    write_atomic(path, pickle.dumps(results))


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command != "run":
        parser.print_help(sys.stderr)
        return 2
    if args.rank_logs and "RANK" in os.environ:
        _rank_logs(args.rank_logs, int(os.environ["RANK"]))
    try:
        env = TorchrunEnv.from_environ()
    except ConfigError as err:
        return fail_input(args, str(err))
    from labkit.launchers.reaper import die_with_parent

    die_with_parent()  # if the torchrun agent dies, this worker goes with it
    try:
        # 1. flags -> validated config(s); backend and threads chosen for this node
        configs = torchrun_configs(args, extra, env,
                                   any(a.startswith("--world-size") for a in argv))
        backends = [resolve_backend(c.backend if args.config else args.backend,
                                    env.local_world_size) for c in configs]
        problems = output_problems(args) if env.rank == 0 else []  # rank 0 writes them
        if problems:
            raise ConfigError(problems)
    except ConfigError as err:
        # every rank rejects the same flags: rank 0 speaks for all of them
        return fail_input(args, str(err)) if env.rank == 0 else 2
    results = []
    for i, (config, backend) in enumerate(zip(configs, backends)):
        code, result = run_under_torchrun(args, config, env, backend, t0, i)
        if code != 0:
            return code
        results.append(result)
        t0 = time.monotonic()
    if args.save_result and env.rank == 0:
        _save_results(args.save_result, results)
    return 0


def torchrun_store(rank: int, world_size: int, job: int = 0) -> Any:
    """The env:// store torchrun set up, namespaced by restart attempt (and job).

    After ``torchrun --max-restarts`` restarts a group, the store may still hold the keys the
    killed attempt wrote (its gloo addresses); new ranks that read them hang connecting to
    dead processes. A per-attempt prefix (TORCHELASTIC_RESTART_COUNT) keeps attempts apart;
    ``job`` does the same for several runs one after the other in the same processes.
    """
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"labkit/attempt_{attempt}" + (f"/job_{job}" if job else "")
    return dist.PrefixStore(prefix, store)


def exit_rank(code: int) -> NoReturn:
    """Leave the way labkit's own ranks leave (``labkit.launchers.rank_main.leave``): flush
    what was printed, then ``os._exit``, skipping the interpreter's finalization. The
    process group is already destroyed by then, but native threads of torch's store and
    gloo can still be torn down in the wrong order during finalization and abort the rank
    ("terminate called without an active exception", SIGABRT). CI met that once, on rank 1
    at the end of a standalone torchrun run: the agent took the abort for a failure and
    stopped rank 0 before it printed its result (40 quiet and busy reruns did not repeat it)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    exit_rank(main())
