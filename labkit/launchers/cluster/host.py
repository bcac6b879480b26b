"""The cluster's "operator": builds the network, measures it, starts one torchrun agent per node.

``python -m labkit.launchers.cluster.host RUN_DIR`` is started by ``labkit.launchers.cluster.launcher`` (as
root directly; otherwise inside ``unshare --user --map-root-user --net --mount``) and reads
``RUN_DIR/spec.json``. Phases:

1. (userns only) mount a private tmpfs on /run, so ``ip netns add`` has a place for its
   names that nobody outside this sandbox sees;
2. create the namespaces and cables and shape them (``labkit.launchers.cluster.netns``);
3. measure the link between node 0 and node 1 (``labkit.launchers.cluster.probe``) -> link.json;
4. start, inside every node's namespace, the command an instructor types on each machine
   of a real cluster::

       torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d \\
           --rdzv-endpoint 10.77.0.1:29400 --local-addr 10.77.0.<k+1> -m labkit.worker run ...

   with ``GLOO_SOCKET_IFNAME`` set to the node's cable, so ranks on different nodes talk
   over the shaped link and ranks on one node over its loopback;
5. wait; the first agent that fails gives the others ``GRACE_S`` to report, then they are
   stopped (a dead peer would otherwise leave them blocked until gloo's timeout);
6. always, also on SIGTERM / SIGINT: stop the agents, delete the namespaces.

Port 29400 is fixed on purpose: it lives in this run's private namespaces, so no other run
or program can hold it. This process never imports torch.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from labkit.config.links import LinkSpec
from labkit.launchers.cluster import leftovers
from labkit.launchers.cluster.netns import Topology, address, run_cmd
from labkit.launchers.reaper import die_with_parent  # runs in each child before exec: dies with us

RDZV_PORT = 29400
PROBE_PORT = 29401
GRACE_S = 2.0
STOP_S = 3.0


def start(argv: list[str], env: dict[str, str], log: Path | None) -> subprocess.Popen[bytes]:
    """A child in this process group (the launcher kills the group), dying with us."""
    out = open(log, "wb") if log is not None else subprocess.PIPE  # noqa: SIM115
    try:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]


def measure_link(topo: Topology, env: dict[str, str], seconds: float) -> dict[str, Any]:
    """Phase 3: round trip and goodput from node 0 to node 1 over the shaped link."""
    probe = [sys.executable, "-m", "labkit.launchers.cluster.probe"]
    server = start([*topo.exec_prefix(1), *probe, "serve", address(1), str(PROBE_PORT)], env,
                   None)
    client = start([*topo.exec_prefix(0), *probe, "send", address(1), str(PROBE_PORT),
                    str(seconds)], env, None)
    try:
        sent, _ = client.communicate(timeout=30 + seconds)
        received, _ = server.communicate(timeout=30)
    finally:
        for p in (client, server):
            if p.poll() is None:
                p.kill()
                p.wait()
    out: dict[str, Any] = {}
    for name, text in (("client", sent), ("server", received)):
        lines = [ln for ln in text.decode(errors="replace").splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"the link probe's {name} printed no result: {text[-2000:]!r}")
        out.update(json.loads(lines[-1]))
    return {"measured_bps": out["goodput_Bps"] * 8, "measured_latency_s": out["rtt_s"] / 2,
            "measured_rtt_s": out["rtt_s"], "probe_bytes": out["bytes"],
            "probe_seconds": out["seconds"], "probe_drained_reads": out["drained_reads"]}


def agent_argv(spec: dict[str, Any], topo: Topology, node: int) -> list[str]:
    """Phase 4: torchrun inside node ``node``'s namespace, the multi-node command."""
    nodes, rdzv_t = spec["nodes"], int(spec["rdzv_timeout_s"])
    return [*topo.exec_prefix(node), sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(nodes), "--nproc-per-node", str(spec["nproc_per_node"]),
            "--rdzv-backend", "c10d", "--rdzv-id", spec["run_id"],
            "--rdzv-endpoint", f"{address(0)}:{RDZV_PORT}",
            "--rdzv-conf", f"is_host={int(node == 0)},join_timeout={rdzv_t},timeout={rdzv_t}",
            "--local-addr", address(node), "--max-restarts", "0", "--monitor-interval", "0.1",
            "-m", "labkit.worker", *spec["worker_args"]]


def wait_agents(procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    """Phase 5: every agent's exit code; after the first failure, GRACE_S for the rest."""
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            stop(procs)
            return [p.poll() for p in procs]
        time.sleep(0.05)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """TERM (torchrun stops its workers), then KILL what is left."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + STOP_S
    for p in alive:
        try:
            p.wait(max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(run_dir: Path) -> int:
    spec = json.loads((run_dir / "spec.json").read_text())
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    env = spec["env"]
    topo = Topology(spec["run_id"], spec["nodes"])
    agents: list[subprocess.Popen[bytes]] = []
    try:
        if spec["mode"] == "userns":  # 1.
            run_cmd("mount", "-t", "tmpfs", "labkit", "/run")
        topo.create()  # 2.
        link = LinkSpec(**spec["link"]) if spec["link"] else None
        report: dict[str, Any] = {"latency_applied": topo.shape(link),
                                  "latency_error": topo.latency_error}
        if spec["nodes"] > 1:  # 3. (one node: its ranks talk over loopback, no link)
            report.update(measure_link(topo, env, spec["probe_seconds"]))
        (run_dir / "link.json").write_text(json.dumps(report))
        if not spec["worker_args"]:
            return 0
        for node in range(spec["nodes"]):  # 4.
            node_env = {**env, "GLOO_SOCKET_IFNAME": topo.names.node_dev(node),
                        "LABKIT_NODE": str(node)}
            agents.append(start(agent_argv(spec, topo, node), node_env,
                                run_dir / f"agent-{node}.log"))
        codes = wait_agents(agents)  # 5.
        (run_dir / "agents.json").write_text(json.dumps(codes))
        return 0 if all(c == 0 for c in codes) else 1
    except Exception as err:  # noqa: BLE001 - the launcher shows it as the run's error
        (run_dir / "host-error.txt").write_text(f"{type(err).__name__}: {err}")
        return 3
    finally:  # 6.
        stop(agents)
        topo.destroy()
        # the launcher died without cleaning up (its lock is free): drop its lock file too
        lock = env.get(leftovers.ENV_LOCK)
        if lock:
            leftovers.is_alive(Path(lock), remove_if_dead=True)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
