"""Elastic training: ``torchrun --max-restarts`` restarts the whole group when a worker dies.

Teaches: an elastic agent (torchrun, ``torch.distributed.run``) watches its workers; when
one dies it stops the rest, re-runs the rendezvous and starts every worker again, up to
``--max-restarts`` times. Training survives only because each new worker resumes from the
last complete checkpoint — so the restart costs the steps since that checkpoint, no more.
See https://pytorch.org/docs/stable/elastic/run.html.

Two halves:
- ``python -m labkit.launchers.elastic ...`` is the worker torchrun starts: it reads RANK / WORLD_SIZE /
  LOCAL_RANK / TORCHELASTIC_RESTART_COUNT from the environment, always resumes from the
  checkpoint directory, injects the requested fault only in the first attempt, and runs the
  strategy with ``labkit.rank.context.run_rank`` (env:// rendezvous). Rank 0 writes a JSON report.
- ``run_elastic(...)`` starts torchrun on this host (``--standalone``) under a timeout and
  returns that report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from labkit.base.errors import ConfigError, RankFailure, RunFailed
from labkit.base.files import write_json_atomic
from labkit.base.progress import waiting
from labkit.base.validate import bool_problem


def _worker(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.launchers.elastic")
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-every", type=int, default=2)
    p.add_argument("--inject-fault", default=None, help="RANK:STEP:KIND, first attempt only")
    p.add_argument("--report", required=True, help="JSON file rank 0 writes at the end")
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)

    from labkit.config.run import RunConfig
    from labkit.launchers.jobs import job_for
    from labkit.launchers.reaper import die_with_parent
    from labkit.launchers.torchrun import torchrun_store
    from labkit.rank.group import run_rank

    die_with_parent()  # if the torchrun agent dies, this worker goes with it
    import faulthandler

    # A hung attempt prints every thread's stack and exits, so torchrun can restart it.
    faulthandler.dump_traceback_later(args.timeout, exit=True)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # 1. the same config every attempt, except the fault, which happens once
    cfg = RunConfig(strategy=args.strategy, world_size=world, steps=args.steps, seed=args.seed,
                    backend="gloo", timeout_s=args.timeout, progress=False,
                    inject_fault=args.inject_fault if attempt == 0 else None,
                    options={"checkpoint_dir": args.checkpoint_dir,
                             "checkpoint_every": args.checkpoint_every, "resume": True})
    job = job_for(cfg, backend="gloo", threads=1)
    # 2. env:// rendezvous through torchrun's MASTER_ADDR / MASTER_PORT, resume, train
    # each attempt meets under its own key prefix (see torchrun_store)
    report = run_rank(job, rank, world, local_rank=local_rank,
                      store=torchrun_store(rank, world))
    # 3. rank 0 reports what this (final) attempt did
    if rank == 0:
        out = report.output
        steps = sorted({e.step for e in report.events if e.step is not None and e.step >= 0})
        mine = out.all_metrics()
        data = {"attempt": attempt, "world_size": world, "params_sha256": out.params_sha256,
                "losses": out.losses, "resumed_from_step": mine.get("resumed_from_step"),
                "checkpoints_saved": mine.get("checkpoints_saved"),
                "steps_run": steps, "finished_at": time.time()}
        write_json_atomic(args.report, data)
    return 0


def run_elastic(*, checkpoint_dir: str | Path, steps: int = 12, nproc: int = 2,
                max_restarts: int = 1, checkpoint_every: int = 2,
                inject_fault: str | None = "1:5:kill", strategy: str = "ddp", seed: int = 0,
                timeout_s: float = 120.0, progress: bool | None = None) -> dict[str, Any]:
    """Run the worker under ``torchrun --standalone --max-restarts`` and return rank 0's report.

    The report says which attempt finished (``attempt`` 1 = recovered after one restart),
    where it resumed, and the final parameter hash. ``progress``: the time so far while
    torchrun runs (``labkit.base.progress.waiting``'s rule).
    """
    if nproc < 1 or max_restarts < 0 or steps < 1:
        raise ConfigError(f"nproc ({nproc}) >= 1, max_restarts ({max_restarts}) >= 0 and steps "
                          f"({steps}) >= 1 are required; e.g. nproc=2, max_restarts=1, steps=12")
    if (problem := bool_problem("progress", progress, optional=True)) is not None:
        raise ConfigError(problem)
    ckpt = Path(checkpoint_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    report = ckpt / "elastic_report.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
           "--monitor-interval=0.2", "-m", "labkit.launchers.elastic", "--strategy", strategy,
           "--steps", str(steps), "--seed", str(seed), "--checkpoint-dir", str(ckpt),
           "--checkpoint-every", str(checkpoint_every), "--report", str(report),
           "--timeout", str(_attempt_budget(timeout_s, max_restarts))]
    if inject_fault:
        cmd += ["--inject-fault", inject_fault]
    # torchrun's agent keeps a torchelastic_* dir per run (and torch a torchinductor_<user>
    # dir) in TMPDIR: a private one, removed afterwards, so nothing piles up in /tmp
    tmp = tempfile.mkdtemp(prefix="labkit-elastic-")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TMPDIR": tmp,
           "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    try:
        # 1. own process group, so a timeout can stop torchrun and every worker it started
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        try:
            with waiting(f"torchrun: {nproc} rank(s), {steps} steps, up to {max_restarts} "
                         f"restart(s)", enabled=progress):
                log, _ = proc.communicate(timeout=timeout_s)
        except BaseException as exc:  # timeout, or Ctrl-C / the notebook's stop button
            log = _stop(proc)
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            raise RunFailed(RankFailure(None, "timeout", f"torchrun did not finish in "
                                        f"{timeout_s} s", log[-4000:])) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode != 0 or not report.is_file():
        raise RunFailed(RankFailure(None, "exit", f"torchrun exited with {proc.returncode}",
                                    log[-4000:]))
    data: dict[str, Any] = json.loads(report.read_text())
    data["log"] = log
    return data


def _attempt_budget(timeout_s: float, max_restarts: int) -> float:
    """Seconds one attempt may take before its watchdog ends it (leaving time to restart)."""
    return max(10.0, min(60.0, timeout_s / (max_restarts + 1.5)))


def _stop(proc: subprocess.Popen[str]) -> str:
    """Stop torchrun and its workers without ever blocking: TERM (the agent stops its
    workers), then KILL the whole group; workers also die with the agent (PDEATHSIG)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.communicate(timeout=grace)[0] or ""
        except subprocess.TimeoutExpired:
            continue
    return ""


if __name__ == "__main__":
    sys.exit(_worker())
