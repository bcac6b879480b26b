"""``labkit.run(config)`` with ``config.nodes > 1``: a run across emulated nodes.

The launcher's guarantees are the supervisor's (``labkit.supervisor``): a timeout on the
whole run, the first failing rank named with its traceback, nothing left behind. How:

1. sweep the leftovers of dead runs (``leftovers.sweep``), take a fresh run id and hold its
   lock for the whole run;
2. write the run's spec and the ranks' ``RunConfig`` into a private run directory and start
   ``labkit.cluster.host`` in its own session (as root directly, otherwise inside
   ``unshare --user --map-root-user --net --mount``); it builds the network, measures the
   link and starts one torchrun agent per node;
3. wait for it under ``config.timeout_s``; on timeout ask every rank for its Python stack
   (SIGUSR1) to name the one that stopped outside communication; on Ctrl-C just stop;
4. always: SIGTERM the host (it stops the agents and deletes the namespaces), SIGKILL its
   process group if it lingers, then sweep this run's id (namespaces, processes) and drop
   the lock;
5. read rank 0's pickled ``RunResult`` (the same type ``labkit.run`` returns: every rank of
   every node on one timeline), add ``metrics["link"]`` (the shaped link beside what the
   probe measured) and the rank-to-node map; or raise ``RunFailed`` naming the failing rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from labkit.board import Board
from labkit.cluster import leftovers, netns
from labkit.cluster.links import LinkSpec, parse_link
from labkit.cluster.support import USERNS_CMD, support
from labkit.errors import ConfigError, RankFailure, RunFailed
from labkit.rank import _die_with_parent

PROBE_SECONDS = 0.5
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GLOO_SOCKET_IFNAME")


def _child_env(run: leftovers.RunLock, threads: int) -> dict[str, str]:
    from labkit.supervisor import _child_env as supervisor_env

    env = {k: v for k, v in supervisor_env().items() if k not in _TORCHRUN_ENV
           and not k.startswith("TORCHELASTIC_")}
    env.update({leftovers.ENV_RUN: run.run_id, leftovers.ENV_LOCK: str(run.path),
                "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
    return env


class Session:
    """One start of ``labkit.cluster.host``: the network, the probe, maybe the agents."""

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
        self.dir = Path(tempfile.mkdtemp(prefix="labkit-cluster-"))
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
                "env": _child_env(self.run, self.threads)}
        env: dict[str, str] = spec["env"]  # type: ignore[assignment]
        (self.dir / "spec.json").write_text(json.dumps(spec))
        if self.worker_args:  # the ranks' progress and in-communication flags
            self.board = Board.create(str(self.dir / "board"),
                                      self.nodes * self.nproc_per_node)
        cmd = [sys.executable, "-m", "labkit.cluster.host", str(self.dir)]
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
                and b"labkit.worker" in _cmdline(pid) and b"torch.distributed.run" not in
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
                out["note"] = (f"latency {self.link.latency_s * 1e3:g} ms not applied: this "
                               f"kernel has no netem qdisc (sch_netem); the latency is the "
                               f"machine's own (measured)")
        return out

    def rank_logs(self) -> dict[int, str]:
        logs = {}
        for path in self.dir.glob("rank-*.log"):
            logs[int(path.stem.split("-")[1])] = path.read_text(errors="replace")
        return logs

    def agent_logs(self) -> list[str]:
        return [(self.dir / f"agent-{k}.log").read_text(errors="replace")
                if (self.dir / f"agent-{k}.log").exists() else "" for k in range(self.nodes)]


def _term_with_parent() -> None:
    _die_with_parent(signal.SIGTERM)  # imported at the top: no imports after fork


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
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


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def measure_link(link: str | None, *, nodes: int = 2, seconds: float = PROBE_SECONDS,
                 timeout_s: float = 60.0) -> dict[str, Any]:
    """Build a two-node network shaped to ``link``, measure it, tear it down.

    Returns ``metrics["link"]``'s fields: the spec (``rate_bps``, ``latency_s``) and
    ``measured_bps`` (TCP goodput), ``measured_latency_s`` (round trip / 2).
    """
    spec = parse_link(link) if link is not None else None
    with _sigterm_as_exit(), Session(nodes=nodes, link=spec, timeout_s=timeout_s,
                                     probe_seconds=seconds) as s:
        s.start()
        code = s.wait()
        if code != 0:
            raise RunFailed(RankFailure(None, "timeout" if s.timed_out else "exit",
                                        s.host_error() or f"the link probe exited with {code}",
                                        _tail(s.dir / "host.log")))
        return s.link_report()


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def run_cluster(config: Any, backend: str) -> Any:
    """Run ``config`` on ``config.nodes`` emulated nodes; the same ``RunResult`` as
    ``labkit.run``, plus ``metrics["link"]``, ``metrics["node_of_rank"]``."""
    return run_many([config], backend, _warn_depth=4)[0]  # warnings point at labkit.run's caller


def run_many(configs: list[Any], backend: str = "gloo", *, _warn_depth: int = 2) -> list[Any]:
    """Several runs on the same emulated nodes and link, one after the other in one torchrun
    job (each with its own process group): one start-up and one link probe for all.

    Every config must have the same ``nodes``, ``link`` and ``world_size``. ``nodes=1``
    means one emulated node (its ranks talk over loopback, as under ``labkit.run``, but
    several runs share one start-up). Returns one ``RunResult`` per config; the first
    failure raises ``RunFailed`` naming its rank.
    """
    from labkit.cluster.failures import pick_failure, timeout_failure

    if not configs:
        raise ConfigError("run_many needs at least one RunConfig")
    first = configs[0]
    shape = {(c.nodes, c.link, c.world_size) for c in configs}
    if len(shape) > 1:
        raise ConfigError(f"run_many needs configs with the same nodes, link and world_size, "
                          f"got (nodes, link, world_size) = {sorted(shape, key=str)}")
    link = parse_link(first.link) if first.link else None
    t0 = time.monotonic()
    with _sigterm_as_exit(), Session(nodes=first.nodes, link=link,
                                     timeout_s=sum(c.timeout_s for c in configs),
                                     nproc_per_node=first.world_size // first.nodes,
                                     threads=first.threads()) as s:
        ranks = [c.replace(nodes=1, link=None, progress=False, backend=backend,
                           threads_per_rank=c.threads()).to_json() for c in configs]
        (s.dir / "config.json").write_text(json.dumps(ranks))
        s.worker_args = ["run", first.strategy, "--config", str(s.dir / "config.json"),
                         "--save-result", str(s.dir / "result.pkl"), "--rank-logs",
                         str(s.dir), "--json"]
        s.start()
        try:
            code = s.wait()
        except KeyboardInterrupt:
            s.stop()
            raise
        wall = time.monotonic() - t0
        logs = s.rank_logs()
        ordered_logs = [logs.get(r, "") for r in range(first.world_size)]
        if s.timed_out:
            err: RunFailed = timeout_failure(s.timeout_s, s.stacks, s.status)
        elif s.host_error():
            raise netns.NetworkSetupError(f"{s.host_error()}\n{_tail(s.dir / 'host.log')}")
        elif code != 0 or not (s.dir / "result.pkl").exists():
            failure, others = pick_failure(logs, s.agent_logs(), code)
            err = RunFailed(failure, others)
        else:
            with open(s.dir / "result.pkl", "rb") as f:
                results = pickle.load(f)
            report = s.link_report()
            for config, result in zip(configs, results):
                # wall_s: the whole job's (one start-up serves every config)
                result.config, result.logs, result.wall_s = config, ordered_logs, wall
                _add_cluster_metrics(result, report, config)
            if report.get("note"):
                warnings.warn(report["note"], stacklevel=_warn_depth)
            return results
        err.logs = ordered_logs  # type: ignore[attr-defined]
        raise err


def _add_cluster_metrics(result: Any, link: dict[str, Any], config: Any) -> None:
    rows = result.timeline.meta.get("ranks", [])
    node_of_rank = [int(row["node"]) for row in sorted(rows, key=lambda r: r["rank"])]
    link = link if config.nodes > 1 else {}
    result.metrics["link"] = link
    result.metrics["nodes"] = config.nodes
    result.metrics["node_of_rank"] = node_of_rank
    result.timeline.meta.update({"config": config.to_json(), "nodes": config.nodes,
                                 "node_of_rank": node_of_rank, "link": link})
