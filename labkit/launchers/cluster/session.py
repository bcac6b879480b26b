"""One start of an emulated cluster, seen from the launcher: start, wait, stop, read back.

``Session`` holds what the launcher's guarantees need (``labkit.launchers.cluster.launcher``): the run
id and its lock (``leftovers``), a private run directory, the host process in its own
session (PR_SET_PDEATHSIG: it tears down even if the launcher is killed), a timeout with
the ranks' stacks and status board read before stopping, and, always on exit, a stop, a
sweep of this run's id and the lock released. The agents and ranks get the run directory's
``tmp`` as their TMPDIR, so what torchrun and torch put there goes with the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from labkit.base.errors import ConfigError
from labkit.base.netsupport import USERNS_CMD, support
from labkit.config.links import LinkSpec
from labkit.launchers.board import Board
from labkit.launchers.cluster import leftovers, netns
from labkit.launchers.reaper import die_with_parent

PROBE_SECONDS = 0.5
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GLOO_SOCKET_IFNAME")


def _child_env(run: leftovers.RunLock, threads: int, tmp: Path) -> dict[str, str]:
    """The agents' and ranks' environment. Their TMPDIR is the run's private directory:
    torchrun's ``torchelastic_*`` dirs and torch's ``torchinductor_<user>`` cache land there
    and go with it, instead of piling up in the caller's temp dir run after run."""
    from labkit.launchers.supervisor import child_env as supervisor_env

    env = {k: v for k, v in supervisor_env().items() if k not in _TORCHRUN_ENV
           and not k.startswith("TORCHELASTIC_")}
    env.update({leftovers.ENV_RUN: run.run_id, leftovers.ENV_LOCK: str(run.path),
                "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)})
    return env


class Session:
    """One start of ``labkit.launchers.cluster.host``: the network, the probe, maybe the agents."""

    def __init__(self, *, nodes: int, link: LinkSpec | None, timeout_s: float,
                 nproc_per_node: int = 1, threads: int = 1, worker_args: list[str] | None = None,
                 probe_seconds: float = PROBE_SECONDS):
        where = support()
        if not where.available:
            raise ConfigError(f"emulated nodes are not available here: {where.reason}")
        self.mode = where.mode
        self.nodes, self.link, self.timeout_s = nodes, link, timeout_s
        self.nproc_per_node, self.threads = nproc_per_node, threads
        self.worker_args = worker_args or []
        self.probe_seconds = probe_seconds
        self.dir = Path()  # the private run directory, made on entering
        self.run: leftovers.RunLock | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.timed_out = False
        self.stacks: dict[int, str] = {}
        self.board: Board | None = None
        self.status: dict[int, tuple[int, int]] = {}
        """At a timeout: rank -> (step, 1 if blocked in communication else 0)."""

    # ---- 1-4 ------------------------------------------------------------------------------
    def __enter__(self) -> Session:
        leftovers.sweep()
        existing = netns.labkit_namespaces() if self.mode == "root" else []
        self.run = leftovers.new_run(existing)
        try:
            self.dir = Path(tempfile.mkdtemp(prefix=f"labkit-cluster-{self.run.run_id}-"))
        except OSError:
            self.run.release()
            raise
        return self

    def start(self) -> None:
        assert self.run is not None and self.mode is not None
        link = None if self.link is None else {
            "text": self.link.text, "rate_bps": self.link.rate_bps,
            "latency_s": self.link.latency_s, "preset": self.link.preset}
        spec = {"run_id": self.run.run_id, "nodes": self.nodes, "mode": self.mode,
                "nproc_per_node": self.nproc_per_node, "link": link,
                "probe_seconds": self.probe_seconds, "worker_args": self.worker_args,
                "rdzv_timeout_s": max(30, int(self.timeout_s)),
                "env": _child_env(self.run, self.threads, self.dir / "tmp")}
        env: dict[str, str] = spec["env"]  # type: ignore[assignment]
        (self.dir / "tmp").mkdir(exist_ok=True)
        (self.dir / "spec.json").write_text(json.dumps(spec))
        if self.worker_args:  # the ranks' progress and in-communication flags
            self.board = Board.create(str(self.dir / "board"),
                                      self.nodes * self.nproc_per_node)
        cmd = [sys.executable, "-m", "labkit.launchers.cluster.host", str(self.dir)]
        if self.mode == "userns":
            cmd = [*USERNS_CMD, "--", *cmd]
        log = open(self.dir / "host.log", "wb")  # noqa: SIM115
        try:
            # if this process dies however it dies, the host gets SIGTERM and tears down
            self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_term_with_parent)
        finally:
            log.close()

    def wait(self) -> int:
        """The host's exit code, or after ``timeout_s`` mark the run timed out and stop it."""
        assert self.proc is not None
        try:
            return self.proc.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.stacks = self._collect_stacks()
            self.stop()
            return -1

    def _collect_stacks(self) -> dict[int, str]:
        """Ask every rank still running to print its stack (the worker handles SIGUSR1)."""
        assert self.run is not None
        pids = [pid for pid, rid, _ in leftovers.run_processes() if rid == self.run.run_id
                and "labkit.worker" in _cmdline(pid) and "torch.distributed.run" not in
                _cmdline(pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
        if self.board is not None:
            self.status = {r: (self.board.progress(r).value, self.board.status(r).value)
                           for r in range(self.board.world_size)}
        stacks = {}
        for path in self.dir.glob("stack-*.txt"):
            text = path.read_text(errors="replace")
            if text.strip():
                stacks[int(path.stem.split("-")[1])] = text
        return stacks

    def stop(self) -> None:
        """TERM the host (it tears down), then KILL its whole process group."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(netns_teardown_s(self.nodes))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            if self.board is not None:
                self.board.close()
            if self.run is not None:
                leftovers.sweep(self.run.run_id)
                self.run.release()
                shutil.rmtree(self.dir, ignore_errors=True)

    # ---- what the run left in its directory -----------------------------------------------
    def host_error(self) -> str | None:
        path = self.dir / "host-error.txt"
        return path.read_text() if path.exists() else None

    def link_report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec": None, "preset": None, "rate_bps": None,
                               "latency_s": 0.0}
        if self.link is not None:
            out.update(self.link.to_json())
        path = self.dir / "link.json"
        if path.exists():
            out.update(json.loads(path.read_text()))
        if self.link is not None:
            out["max_busbw_Bps"] = self.link.bytes_per_s
            if self.link.latency_s > 0 and out.get("latency_applied") is False:
                out["note"] = ("latency not applied: netem could not be set up here (is "
                               "the sch_netem kernel module missing? see latency_error), so "
                               "the link keeps the machine's own latency "
                               "(measured_latency_s); the rate is shaped")
        return out

    def partial_timeline(self, world_size: int) -> Any:
        """What the ranks of the run that failed spooled before it (``labkit.trace.spool``)."""
        from labkit.analysis.timeline import Timeline
        from labkit.trace.spool import read_spools

        jobs = sorted(self.dir.glob("spool-*"), key=lambda d: int(d.name.split("-")[1]))
        if not jobs:
            return None
        return Timeline(read_spools(jobs[-1], world_size), world_size, {"failed": True})

    def rank_logs(self) -> dict[int, str]:
        logs = {}
        for path in self.dir.glob("rank-*.log"):
            logs[int(path.stem.split("-")[1])] = path.read_text(errors="replace")
        return logs

    def agent_logs(self) -> list[str]:
        return [(self.dir / f"agent-{k}.log").read_text(errors="replace")
                if (self.dir / f"agent-{k}.log").exists() else "" for k in range(self.nodes)]


def _term_with_parent() -> None:
    die_with_parent(signum=signal.SIGTERM)  # imported at the top: no imports after fork


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """SIGTERM (``timeout``, ``kill``) unwinds like Ctrl-C, so the network is torn down."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def netns_teardown_s(nodes: int) -> float:
    """How long the host may take to stop its agents and delete the namespaces."""
    return 5.0 + 0.2 * nodes


def _cmdline(pid: int) -> str:
    """``pid``'s command line, its words joined by spaces ("" once it is gone)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def log_tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""
