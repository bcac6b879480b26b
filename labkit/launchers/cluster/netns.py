"""Build and tear down an emulated cluster's network: namespaces, veth pairs, a bridge, tc.

Teaches what a cluster's network is made of, with the same tools a datacenter uses
(iproute2: man 8 ip-netns, ip-link, tc-tbf, tc-netem). For a run with id ``ab12c`` and N
nodes::

    labkit-ab12c-n0  (10.77.0.1)  labkitab12cn0 ==veth== labkitab12cs0 ┐
    labkit-ab12c-n1  (10.77.0.2)  labkitab12cn1 ==veth== labkitab12cs1 ┼ bridge labkitab12cbr
    ...                                                                 ┘ in labkit-ab12c-sw

Every node is a network namespace with its own loopback (ranks on one node talk over it, at
memory speed) and one veth "cable" to a switch namespace holding a bridge (a star, like a
top-of-rack switch). Each cable is shaped in both directions with a token bucket (tbf:
the rate) and, on the node's side, a netem delay (the latency), so a packet from node 0 to
node 1 pays the rate on node 0's uplink and node 1's downlink and the latency once. All
interfaces are created inside the run's namespaces, so the host's own interfaces and
routes are never touched; addresses (10.77.0.0/24) exist only there and have no route out.

Jumbo frames (MTU 9000, as on most cluster networks) keep TCP/IP headers below 1% of what
the link carries, so the goodput a transfer measures is within a few percent of the rate.
"""

from __future__ import annotations

import signal
import subprocess
from dataclasses import dataclass

from labkit.base.errors import LabError
from labkit.config.links import LinkSpec

PREFIX = "labkit"
SUBNET = "10.77.0"
MTU = 9000
TBF_QUEUE_S = 0.2  # how long a full tbf queue takes to drain: deep enough for TCP bursts


class NetworkSetupError(LabError):
    """An ``ip`` or ``tc`` command failed while building the emulated network."""


def address(node: int) -> str:
    """Node k's address on the emulated network."""
    return f"{SUBNET}.{node + 1}"


@dataclass(frozen=True)
class Names:
    """Every name a run's network uses: ``labkit`` + run id + role (interfaces <= 15 chars)."""

    run_id: str

    def node_ns(self, k: int) -> str:
        return f"{PREFIX}-{self.run_id}-n{k}"

    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}-{self.run_id}-sw"

    def node_dev(self, k: int) -> str:
        return f"{PREFIX}{self.run_id}n{k}"

    def switch_dev(self, k: int) -> str:
        return f"{PREFIX}{self.run_id}s{k}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run_id}br"


def run_cmd(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an iproute2 command; a failure names the command and what it printed."""
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NetworkSetupError(f"`{' '.join(argv)}` could not run: {err}") from None
    if check and p.returncode != 0:
        raise NetworkSetupError(f"`{' '.join(argv)}` failed (exit {p.returncode}): "
                                f"{(p.stderr or p.stdout).strip()}")
    return p


def tbf_args(rate_bps: float) -> list[str]:
    """tc-tbf parameters for ``rate_bps``: a bucket of ~4 ms at that rate (never less than a
    few jumbo frames) and a queue of ``TBF_QUEUE_S``."""
    rate_Bps = rate_bps / 8
    burst = max(int(rate_Bps * 0.004), 4 * (MTU + 100))
    limit = max(int(rate_Bps * TBF_QUEUE_S), 2 * burst)
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "limit", str(limit)]


def netem_args(latency_s: float) -> list[str]:
    """tc-netem parameters: a fixed one-way delay, with a queue long enough for the link."""
    return ["netem", "delay", f"{latency_s * 1e6:.0f}us", "limit", "100000"]


class Topology:
    """One run's namespaces and cables; ``create()``, ``shape(link)``, ``destroy()``."""

    def __init__(self, run_id: str, nodes: int):
        self.names = Names(run_id)
        self.nodes = nodes
        self.created: list[str] = []
        self.latency_error: str | None = None
        """Why netem could not add the latency (None: applied, or none asked for)."""

    def exec_prefix(self, node: int) -> list[str]:
        """argv prefix that runs a command inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.names.node_ns(node)]

    def create(self) -> None:
        """Namespaces, bridge, one veth per node, addresses; loopback up everywhere."""
        n = self.names
        # 1. the switch and the nodes (recorded as created, so destroy() removes them even
        #    if a later command fails)
        for ns in [n.switch_ns] + [n.node_ns(k) for k in range(self.nodes)]:
            run_cmd("ip", "netns", "add", ns)
            self.created.append(ns)
            run_cmd("ip", "-n", ns, "link", "set", "lo", "up")
        run_cmd("ip", "-n", n.switch_ns, "link", "add", "name", n.bridge, "type", "bridge")
        run_cmd("ip", "-n", n.switch_ns, "link", "set", n.bridge, "up")
        # 2. a cable per node: the switch end joins the bridge, the node end gets an address
        for k in range(self.nodes):
            run_cmd("ip", "-n", n.switch_ns, "link", "add", "name", n.switch_dev(k), "mtu",
                    str(MTU), "type", "veth", "peer", "name", n.node_dev(k), "mtu", str(MTU),
                    "netns", n.node_ns(k))
            run_cmd("ip", "-n", n.switch_ns, "link", "set", n.switch_dev(k), "master", n.bridge,
                    "up")
            run_cmd("ip", "-n", n.node_ns(k), "addr", "add", f"{address(k)}/24", "dev",
                    n.node_dev(k))
            run_cmd("ip", "-n", n.node_ns(k), "link", "set", n.node_dev(k), "up")

    def shape(self, link: LinkSpec | None) -> bool:
        """Shape every cable to ``link``; returns whether the latency could be applied.

        Uplink (node side): netem delay as the root qdisc with the tbf under it (the
        recipe of the netem documentation), or tbf alone when there is no latency or netem
        cannot be set up (no sch_netem: ``latency_error`` says why); downlink (switch
        side): tbf alone. Every cable is shaped the same way.
        """
        if link is None:
            return True
        n = self.names
        delay = link.latency_s > 0
        for k in range(self.nodes):
            if delay and not self._uplink_with_delay(k, link):
                delay = False
                for j in range(k):  # the cables shaped before: rate only, like the rest
                    self._uplink_rate_only(j, link)
            if not delay:
                self._uplink_rate_only(k, link)
            run_cmd("tc", "-n", n.switch_ns, "qdisc", "replace", "dev", n.switch_dev(k), "root",
                    *tbf_args(link.rate_bps))
        return delay or link.latency_s == 0

    def _uplink_with_delay(self, k: int, link: LinkSpec) -> bool:
        n = self.names
        base = ["tc", "-n", n.node_ns(k), "qdisc", "replace", "dev", n.node_dev(k)]
        for argv in ([*base, "root", "handle", "1:", *netem_args(link.latency_s)],
                     [*base, "parent", "1:1", "handle", "10:", *tbf_args(link.rate_bps)]):
            p = run_cmd(*argv, check=False)
            if p.returncode != 0:
                self.latency_error = f"`{' '.join(argv)}`: {(p.stderr or p.stdout).strip()}"
                return False
        return True

    def _uplink_rate_only(self, k: int, link: LinkSpec) -> None:
        n = self.names
        run_cmd("tc", "-n", n.node_ns(k), "qdisc", "replace", "dev", n.node_dev(k), "root",
                *tbf_args(link.rate_bps))

    def destroy(self) -> None:
        """Kill what still runs inside the namespaces, then delete them (their veths and
        the bridge go with them). Safe to call twice."""
        for ns in reversed(self.created):
            delete_namespace(ns)
        self.created.clear()


def delete_namespace(ns: str) -> None:
    """SIGKILL every process inside ``ns``, then ``ip netns del`` it (no error if gone)."""
    import os

    p = run_cmd("ip", "netns", "pids", ns, check=False)
    for pid in p.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    run_cmd("ip", "netns", "del", ns, check=False)


def labkit_namespaces() -> list[str]:
    """Names of the labkit namespaces ``ip netns list`` shows on this host."""
    p = run_cmd("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    return [ns for ns in names if ns.startswith(f"{PREFIX}-")]
