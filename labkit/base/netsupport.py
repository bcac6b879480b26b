"""Can this machine emulate a cluster? Root, or unprivileged user namespaces, or neither.

Emulated nodes are Linux network namespaces (``ip netns``) joined by veth pairs and shaped
with ``tc`` (man 8 ip-netns, man 8 tc-tbf, man 8 tc-netem). Creating them needs the
``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN`` capabilities, which a process has in one of two ways:

* **root**: the namespaces are created on the host, named ``labkit-<run id>-n<k>``, and
  visible to ``ip netns list`` while the run lasts (``ip netns exec labkit-...-n1 ss -tni``
  shows the link's TCP connections);
* **userns**: an unprivileged user runs the whole cluster inside
  ``unshare --user --map-root-user --net --mount`` (user namespaces, enabled on most Linux
  desktops), where it is "root" of namespaces nobody else sees; the kernel removes all of
  them when the run's processes exit.

``LABKIT_CLUSTER_MODE`` (root, userns or off) overrides the choice, e.g. to test the
unprivileged path as root or to see what the lessons do without a cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache

MODES = ("root", "userns")
ENV_MODE = "LABKIT_CLUSTER_MODE"
USERNS_CMD = ("unshare", "--user", "--map-root-user", "--net", "--mount")


@dataclass(frozen=True)
class Support:
    """Whether emulated nodes can run here, how, and if not, why not."""

    mode: str | None
    """root, userns, or None (unavailable)."""
    reason: str
    """How it works here, or why it cannot and what would fix it."""

    @property
    def available(self) -> bool:
        return self.mode is not None


def _tools_missing() -> list[str]:
    return [tool for tool in ("ip", "tc") if shutil.which(tool) is None]


def _unshare(argv: tuple[str, ...]) -> tuple[bool, str]:
    """Run ``argv + ("true",)``: can this process create those namespaces? (milliseconds)"""
    if shutil.which("unshare") is None:
        return False, "`unshare` (util-linux) is not installed"
    try:
        p = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=10,
                           check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"`unshare` failed: {err}"
    return p.returncode == 0, p.stderr.strip()


@cache
def userns_works() -> tuple[bool, str]:
    """Try ``unshare --user --map-root-user --net --mount true``."""
    ok, err = _unshare(USERNS_CMD)
    if not ok:
        return False, (f"unprivileged user namespaces are disabled ({err}); an administrator "
                       f"can enable them with `sysctl -w kernel.unprivileged_userns_clone=1` "
                       f"(Debian/Ubuntu) or `sysctl -w user.max_user_namespaces=15000`")
    return True, ""


@cache
def root_works() -> tuple[bool, str]:
    """Root without CAP_SYS_ADMIN (a default container) cannot create namespaces."""
    ok, err = _unshare(("unshare", "--net", "--mount"))
    return ok, "" if ok else (f"root here cannot create network namespaces ({err}); a "
                              f"container needs CAP_NET_ADMIN and CAP_SYS_ADMIN")


def support() -> Support:
    """How this process would create emulated nodes (``mode``), or why it cannot."""
    forced = os.environ.get(ENV_MODE, "").strip().lower()
    if forced == "off":
        return Support(None, f"emulated nodes are turned off ({ENV_MODE}=off)")
    missing = _tools_missing()
    if missing:
        return Support(None, f"{' and '.join(missing)} not found: install iproute2 "
                             f"(`apt-get install iproute2`) for `ip` and `tc`")
    if forced and forced not in MODES:
        return Support(None, f"{ENV_MODE}={forced!r} must be one of root, userns or off")
    root_why = f"{ENV_MODE}=userns" if forced == "userns" else "not root"
    if forced == "root" or (not forced and os.geteuid() == 0):
        if os.geteuid() != 0:
            return Support(None, f"{ENV_MODE}=root but this process is not root")
        ok, root_why = root_works()
        if ok:
            return Support("root", "running as root: network namespaces labkit-<run>-n<k> "
                                   "are created on this host (`ip netns list` shows them "
                                   "during a run)")
        if forced:
            return Support(None, root_why)
    ok, why = userns_works()
    if ok:
        return Support("userns", f"unprivileged user namespaces ({root_why}): the nodes "
                                 f"live inside `unshare --user --map-root-user --net --mount`")
    return Support(None, f"{root_why} and {why}; run as root or enable user namespaces")


@cache
def link_shaping() -> dict[str, bool]:
    """Which tc qdiscs this kernel has: tbf (rates) and netem (latency).

    Tried on the loopback of a throw-away network namespace (``unshare --net``, inside a
    user namespace when not root): it vanishes with the command, nothing to clean up.
    """
    where = support()
    if not where.available:
        return {"tbf": False, "netem": False}
    prefix = ["unshare", "--net"] if where.mode == "root" else list(USERNS_CMD)
    script = ("tc qdisc add dev lo root tbf rate 1mbit burst 16kb limit 32kb >/dev/null 2>&1 "
              "&& echo tbf; tc qdisc del dev lo root >/dev/null 2>&1; "
              "tc qdisc add dev lo root netem delay 1ms >/dev/null 2>&1 && echo netem; true")
    try:
        p = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True,
                           timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {"tbf": False, "netem": False}
    found = p.stdout.split()
    return {"tbf": "tbf" in found, "netem": "netem" in found}
