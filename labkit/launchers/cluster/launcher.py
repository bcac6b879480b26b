"""``labkit.run(config)`` with ``config.nodes > 1``: a run across emulated nodes.

The launcher's guarantees are the supervisor's (``labkit.launchers.supervisor``): a timeout on the
whole run, the first failing rank named with its traceback, nothing left behind. How:

1. sweep the leftovers of dead runs (``leftovers.sweep``), take a fresh run id and hold its
   lock for the whole run (``session.Session``);
2. write the run's spec and the ranks' ``RunConfig`` into a private run directory and start
   ``labkit.launchers.cluster.host`` in its own session (as root directly, otherwise inside
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

import json
import pickle
import time
import warnings
from typing import Any

from labkit.base.errors import ConfigError, RankFailure, RunFailed
from labkit.config.links import LinkWarning, parse_link
from labkit.launchers.cluster import netns
from labkit.launchers.cluster.session import PROBE_SECONDS, Session, log_tail, sigterm_as_exit


def measure_link(link: str | None, *, nodes: int = 2, seconds: float = PROBE_SECONDS,
                 timeout_s: float = 60.0) -> dict[str, Any]:
    """Build a two-node network shaped to ``link``, measure it, tear it down.

    Returns ``metrics["link"]``'s fields: the spec (``rate_bps``, ``latency_s``) and
    ``measured_bps`` (TCP goodput), ``measured_latency_s`` (round trip / 2).
    """
    spec = parse_link(link) if link is not None else None
    with sigterm_as_exit(), Session(nodes=nodes, link=spec, timeout_s=timeout_s,
                                     probe_seconds=seconds) as s:
        s.start()
        code = s.wait()
        if code != 0:
            raise RunFailed(RankFailure(None, "timeout" if s.timed_out else "exit",
                                        s.host_error() or f"the link probe exited with {code}",
                                        log_tail(s.dir / "host.log")))
        return s.link_report()


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
    from labkit.launchers.cluster.failures import pick_failure, timeout_failure

    if not configs:
        raise ConfigError("run_many needs at least one RunConfig")
    first = configs[0]
    shape = {(c.nodes, c.link, c.world_size) for c in configs}
    if len(shape) > 1:
        raise ConfigError(f"run_many needs configs with the same nodes, link and world_size, "
                          f"got (nodes, link, world_size) = {sorted(shape, key=str)}")
    link = parse_link(first.link) if first.link else None
    t0 = time.monotonic()
    with sigterm_as_exit(), Session(nodes=first.nodes, link=link,
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
            raise netns.NetworkSetupError(f"{s.host_error()}\n{log_tail(s.dir / 'host.log')}")
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
                warnings.warn(report["note"], LinkWarning, stacklevel=_warn_depth)
            return results
        err.logs = ordered_logs  # type: ignore[attr-defined]
        err.timeline = s.partial_timeline(first.world_size)
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
