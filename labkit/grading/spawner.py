"""Student servers with limits: each single-user server in a cgroup of its own.

JupyterHub's ``LocalProcessSpawner`` starts every student's server as a plain process of
that student: no memory limit, a process cap (``ulimit -u``) above what the machine's pid
space holds, and all of them in the hub's one cgroup, so one student's runaway notebook
(a fork bomb, a tensor too large) takes the server down for the class (issue 35, item 9).
JupyterHub's ``Spawner.mem_limit`` is documented as a limit the spawner *may* enforce;
``LocalProcessSpawner`` does not. ``LimitedSpawner`` does, the way the grading box does
(:class:`labkit.grading.sandbox.limits.BoxCgroup`, the kernel's cgroup-v1 ``memory.txt`` and
``pids.txt``, cgroup-v2 ``memory.max`` and ``pids.max``):

1. **start**: a fresh cgroup ``<parent>/<user>/labkit-box-...`` with ``pids.max`` and the
   memory limit (v1 where the memory and pids controllers are mounted, else v2 where they
   are delegated);
2. **the server's first step** (``preexec_fn``, still root): its pid into the cgroup, so it
   and every kernel and rank it starts are counted there; where no cgroup could be made,
   rlimits instead (``RLIMIT_NPROC``: that user's processes; ``RLIMIT_DATA``: each
   process's memory), weaker but never nothing; then JupyterHub's own step (the user's
   uid);
3. **stop**: whatever the server left in its cgroup (kernels, ranks) is killed, the cgroup
   removed.

A fork bomb then meets ``pids.max`` and a memory hog the OOM killer inside its own cgroup,
and another student's kernel keeps running (``tests/grading/test_server_limits.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer, Unicode

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, integer, option
from labkit.grading.sandbox.limits import BoxCgroup, Limits, MiB, apply_rlimits


@dataclass(kw_only=True, frozen=True)
class ServerLimits:
    """What one student's server, with all its kernels and ranks, may use."""

    memory_mb: int = option(4096, integer(128, 1 << 24, example=4096))
    """MiB of memory for the server and everything it starts, together."""
    processes: int = option(512, integer(16, 1 << 20, example=512))
    """Processes and threads alive at once (a rank of torch holds a few dozen threads)."""
    parent: str = "/labkit-users"
    """Where the servers' cgroups go, in each cgroup hierarchy (one folder per user)."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if not self.parent.startswith("/"):
            problems.append(f"parent ({self.parent!r}) must be an absolute cgroup path; "
                            "e.g. /labkit-users")
        if problems:
            raise ConfigError(problems)

    def cgroup(self, user: str) -> BoxCgroup | None:
        """A fresh cgroup for one server of ``user``, or None where none can be made."""
        return BoxCgroup.make(Limits(processes=self.processes, memory_mb=self.memory_mb),
                              parent=f"{self.parent.rstrip('/')}/{user}")

    def rlimits(self) -> dict[str, int]:
        """The fallback without a cgroup: the user's processes, each process's memory."""
        return {"NPROC": self.processes, "DATA": self.memory_mb * MiB, "CORE": 0}

    def preexec(self, cgroup: BoxCgroup | None, then: Callable[[], Any] | None = None
                ) -> Callable[[], None]:
        """The server's first step in its own process (as root): join ``cgroup`` (or set
        the rlimits), then ``then`` (JupyterHub's: become the user)."""
        procs = cgroup.procs_files if cgroup is not None else []
        fallback = {} if procs else self.rlimits()

        def first_step() -> None:
            for path in procs:
                with open(path, "w") as fh:  # a failure here stops the spawn: no silent escape
                    fh.write(str(os.getpid()))
            apply_rlimits(fallback)
            if then is not None:
                then()

        return first_step


def check(limits: ServerLimits) -> list[str]:
    """Whether a server's cgroup can be made here (one made and removed), in a report line."""
    probe = limits.cgroup("labkit-probe")
    if probe is None:
        return [f"NOT protected: students' servers have rlimits only ({limits.processes} "
                f"processes per user, {limits.memory_mb} MiB per process): no cgroup with "
                "memory and pids here (cgroup v2 needs them delegated to the hub)"]
    clear(probe)
    for folder in probe.dirs:  # the probe's own user folder too
        with contextlib.suppress(OSError):
            folder.parent.rmdir()
    kind = f"cgroup v{probe.version}"
    return [f"protected: the class from one student's server (each in its own {kind}: "
            f"{limits.memory_mb} MiB, {limits.processes} processes)"]


def clear(cgroup: BoxCgroup | None) -> int:
    """Kill what is left in a server's cgroup and remove it; how many were killed."""
    if cgroup is None:
        return 0
    killed = 0
    for _ in range(200):  # a fork bomb refills what is killed: pass again until it is empty
        pids = cgroup.pids()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    cgroup.remove()
    return killed


class LimitedSpawner(LocalProcessSpawner):  # type: ignore[misc]
    """``LocalProcessSpawner`` that puts each server in a cgroup of its own
    (``c.JupyterHub.spawner_class = 'labkit.grading.spawner.LimitedSpawner'``); the
    limits are ``Spawner.mem_limit`` and ``LimitedSpawner.pids_limit``."""

    pids_limit = Integer(512, help="Processes and threads one server may hold.").tag(config=True)
    cgroup_parent = Unicode("/labkit-users", help="Where the servers' cgroups go.").tag(
        config=True)
    _cgroup: BoxCgroup | None = None

    def _limits(self) -> ServerLimits:
        memory = int(self.mem_limit or 4096 * MiB) // MiB
        return ServerLimits(memory_mb=memory, processes=self.pids_limit,
                            parent=self.cgroup_parent)

    def make_preexec_fn(self, name: str) -> Callable[[], None]:
        limits = self._limits()
        self._cgroup = limits.cgroup(name)
        if self._cgroup is None:
            self.log.warning("no cgroup for %s's server: rlimits only", name)
        return limits.preexec(self._cgroup, super().make_preexec_fn(name))

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        killed = clear(self._cgroup)
        if killed:
            self.log.info("stopped %d processes left in %s's server cgroup", killed,
                          self.user.name)
        self._cgroup = None
