"""What one grading box may use, and how each limit is enforced and noticed.

nbgrader guards only against endless loops (a cell timeout); on a shared course server a
submission that forks without end, touches 30 GB or fills ``/tmp`` (a RAM-backed tmpfs)
would take the machine down with it. Each box therefore gets:

* **processes** -- a cgroup ``pids.max`` where the grader may make a cgroup (root, or a
  folder delegated to the instructor by ``labkit course hub``), else ``RLIMIT_NPROC``,
  set by the box's own first process (``boxinit``) inside the box's user namespace so it
  counts the box's processes only. Linux counts threads as tasks, so this bounds both.
* **memory** -- a cgroup ``memory`` limit for the whole box, and ``RLIMIT_DATA`` for each
  process (a 30 GB ``bytearray`` or ``numpy.ones`` fails at once with ``MemoryError``).
* **/tmp** -- a size-limited tmpfs (``--size``) for ``/tmp`` and ``/dev/shm``.
* **CPU time** -- measured from outside (:mod:`procfs`), per cell and per notebook;
  ``RLIMIT_CPU`` per process as a backstop. Where the ``cpu`` controller is there too, the
  box is one group to the scheduler: a thousand spinning processes in it get the CPU
  share of one, and the grader (and every other user of the machine) keeps its own.

The cgroup is created *under* the grader's own cgroup (per controller), so a box never
escapes a limit the grader itself runs under. See the kernel's cgroup-v1 ``pids.txt`` and
``memory.txt`` and cgroup-v2 ``cgroup-v2.rst`` (``pids.max``, ``memory.max``, ``*.events``).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.base.errors import ConfigError
from labkit.base.validate import check_fields, integer, option, real

MiB = 2**20


@dataclass(kw_only=True, frozen=True)
class Limits:
    """Limits of one grading box (the notebook's, or one rank's)."""

    processes: int = option(512, integer(16, 1 << 20, example=512))
    """Processes and threads alive in one box at once."""
    memory_mb: int = option(4096, integer(128, 1 << 24, example=4096))
    """MiB of memory for one box in all (cgroup), and for each of its processes (RLIMIT_DATA)."""
    tmp_mb: int = option(512, integer(4, 1 << 24, example=512))
    """MiB the box's /tmp (and, separately, /dev/shm) may hold."""
    cell_cpu_s: float = option(60.0, real(0, 86400, example=60, unit=" s"))
    """CPU seconds one student cell may use, over every process it starts."""
    test_cpu_s: float = option(600.0, real(0, 86400, example=600, unit=" s"))
    """CPU seconds one test cell may spend in the boxes (the student's functions, their ranks)."""
    notebook_cpu_s: float = option(1800.0, real(0, 864000, example=1800, unit=" s"))
    """CPU seconds the whole notebook may use in its boxes."""
    notebook_timeout: float = option(1200.0, real(0, 864000, example=1200, unit=" s"))
    """Wall seconds the whole notebook's box work may take; later cells are not run."""

    def __post_init__(self) -> None:
        problems = check_fields(self)
        if problems:
            raise ConfigError(problems)

    def rlimits(self) -> dict[str, int]:
        """Per-process limits, as ``resource.RLIMIT_<name>``: soft value (hard a little above)."""
        return {"NPROC": self.processes, "DATA": self.memory_mb * MiB,
                "CPU": int(self.notebook_cpu_s) + 5, "FSIZE": self.tmp_mb * MiB, "CORE": 0}


def apply_rlimits(values: dict[str, int]) -> None:
    """Set each ``resource.RLIMIT_<name>`` (in the process that will run the box)."""
    import resource

    for name, value in values.items():
        which = getattr(resource, f"RLIMIT_{name}")
        _, hard = resource.getrlimit(which)
        # CPU: the soft limit sends SIGXCPU, the hard one (5 s later) SIGKILL
        top = value + 5 if name == "CPU" else value
        if hard != resource.RLIM_INFINITY:
            top = min(top, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(which, (min(value, top), top))


# ---- cgroups ------------------------------------------------------------------------------
def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of every cgroup file system."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if extra and extra[0] in ("cgroup", "cgroup2"):
            out.append((fields[4], extra[0], set(extra[-1].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _place(mount: str, own: str, parent: str | None) -> Path:
    """Where boxes go: ``parent`` absolute in the hierarchy, ``./x`` under our own, else our own."""
    if parent is None:
        rel = own
    elif parent.startswith("./"):
        rel = f"{own.rstrip('/')}/{parent[2:]}"
    else:
        rel = parent
    return Path(mount) / rel.lstrip("/")


_BOX = re.compile(r"labkit-box-(\d+)-[0-9a-f]{8}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_dead_boxes(folder: Path) -> int:
    """Remove the empty box cgroups in ``folder`` whose grader died before removing them (a
    grader stopped by SIGTERM or SIGKILL mid-grading); returns how many went. A live
    grader's boxes, and any box that still holds a process, stay."""
    gone = 0
    try:
        children = list(folder.iterdir())
    except OSError:
        return 0
    for child in children:
        m = _BOX.fullmatch(child.name)
        if m is None or _alive(int(m.group(1))):
            continue
        with contextlib.suppress(OSError):  # not empty: something still runs in it
            child.rmdir()
            gone += 1
    return gone


def _homes(parent: str | None) -> tuple[int, list[tuple[str, Path]]]:
    """Where this process's boxes go: (1, a folder per v1 controller -- pids and memory, cpu
    where mounted), (2, the one v2 folder), or (0, []) where neither offers pids + memory."""
    mounts, own = _mounts(), _own_paths()
    v1 = {c: m for m, kind, opts in mounts if kind == "cgroup"
          for c in ("pids", "memory", "cpu") if c in opts}
    if "pids" in v1 and "memory" in v1:
        return 1, [(c, _place(m, own.get(c, "/"), parent)) for c, m in sorted(v1.items())]
    v2 = next((m for m, kind, _ in mounts if kind == "cgroup2"), None)
    if v2 is not None and {"pids", "memory"} <= set(
            Path(v2, "cgroup.controllers").read_text().split()):
        return 2, [("", _place(v2, own.get("", "/"), parent or "/labkit-grading"))]
    return 0, []


def box_parents(parent: str | None = None) -> list[Path]:
    """The folders this process's boxes go in -- where :func:`sweep_dead_boxes` looks, and
    where a test looks for boxes left behind (not the whole machine: another session's are
    not ours)."""
    try:
        return [folder for _, folder in _homes(parent)[1]]
    except OSError:
        return []


class BoxCgroup:
    """One box's cgroup: v1 (a folder per controller, pids + memory) or v2 (one folder)."""

    def __init__(self, dirs: list[Path], version: int):
        self.dirs, self.version = dirs, version

    @classmethod
    def make(cls, limits: Limits, parent: str | None = None) -> BoxCgroup | None:
        """A fresh cgroup with the limits written, or None where the grader may not make one."""
        name = f"labkit-box-{os.getpid()}-{secrets.token_hex(4)}"
        made: list[Path] = []
        try:
            version, homes = _homes(parent)
            if version == 2:  # one folder: turn the controllers on for the boxes below it
                base = homes[0][1]
                base.mkdir(exist_ok=True)
                with contextlib.suppress(OSError):  # already on, or delegated to us that way
                    (base.parent / "cgroup.subtree_control").write_text("+pids +memory +cpu")
                    (base / "cgroup.subtree_control").write_text("+pids +memory +cpu")
            elif version == 0:
                return None
            for controller, home in homes:
                sweep_dead_boxes(home)
                folder = home / name
                try:
                    folder.mkdir(parents=version == 1 and parent is not None)
                except OSError:
                    if controller == "cpu":  # fair share is a bonus, not a limit
                        continue
                    raise
                made.append(folder)
            box = cls(made, version)
            box._write(limits)
            return box
        except OSError:
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            return None

    def _write(self, limits: Limits) -> None:
        memory = str(limits.memory_mb * MiB)
        for folder in self.dirs:
            files = {"pids.max": str(limits.processes), "memory.limit_in_bytes": memory,
                     "memory.memsw.limit_in_bytes": memory, "memory.max": memory,
                     "memory.swap.max": "0"}
            for file, value in files.items():
                if (folder / file).exists():
                    with contextlib.suppress(OSError):  # memsw / swap.max: without swap accounting
                        (folder / file).write_text(value)

    @property
    def procs_files(self) -> list[str]:
        """What the box's first process writes its pid into (before it starts anything)."""
        return [str(folder / "cgroup.procs") for folder in self.dirs]

    def events(self) -> dict[str, int]:
        """How often the box hit its limits: ``pids`` (a fork refused), ``oom`` (a process
        killed for memory), ``memory`` (an allocation over the limit)."""
        out = {"pids": 0, "oom": 0, "memory": 0}
        for folder in self.dirs:
            for file, key, word in (("pids.events", "pids", "max"),
                                    ("memory.oom_control", "oom", "oom_kill"),
                                    ("memory.events", "oom", "oom_kill"),
                                    ("memory.events", "memory", "max")):
                out[key] += _counter(folder / file, word)
            out["memory"] += _number(folder / "memory.failcnt")
        return out

    def pids(self) -> list[int]:
        """Processes in the box's cgroup now."""
        out: set[int] = set()
        for folder in self.dirs:
            try:
                out.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return sorted(out)

    def remove(self, wait_s: float = 20.0) -> None:
        """Remove the folders once the killed processes have left them (rmdir needs empty),
        SIGKILLing any still listed meanwhile. A fork bomb's 256 processes took more than 3 s
        to leave on a loaded machine (the suite beside the class): ``wait_s`` is generous,
        and an empty box's folders go at once."""
        deadline = time.monotonic() + wait_s
        for folder in self.dirs:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    for pid in self.pids():  # a straggler the pid namespace did not take
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    time.sleep(0.05)


def _counter(path: Path, word: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == word:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _number(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def enter_cgroup(procs_files: list[str]) -> None:
    """Move the calling process into the box's cgroup (runs between fork and exec)."""
    pid = str(os.getpid()).encode()
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
