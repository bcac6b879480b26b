"""How the grading box is built: which sandbox this machine has, and its command line.

See :mod:`labkit.grading.sandbox.box` for what each mode protects. ``bwrap`` builds a new
root from read-only binds; ``unshare`` keeps the host's tree but remounts it read-only and
hides the course's and the home folder's entries under empty mounts; ``none`` only
scrubs the environment. Every mode gets the same clean environment (``env``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

from labkit.base.errors import ConfigError
from labkit.grading.sandbox.limits import Limits, MiB

MODES = ("auto", "bwrap", "unshare", "none")
NOBODY = 65534
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "hosts",
             "nsswitch.conf", "localtime", "host.conf")


def _probe(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@cache
def available(mode: str) -> bool:
    """Does ``mode`` work on this machine (the tool exists and namespaces are allowed)?"""
    if mode == "bwrap":  # 0.8 or later: --disable-userns, --as-pid-1 and a sized tmpfs
        return shutil.which("bwrap") is not None and _probe(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--unshare-user",
             "--disable-userns", "--as-pid-1", "--size", "65536", "--tmpfs", "/tmp",
             "--die-with-parent", "true"])
    if mode == "unshare":
        return shutil.which("unshare") is not None and _probe(
            ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "--net",
             "true"])
    return mode == "none"


def resolve_mode(mode: str | None = None) -> str:
    """The mode to use: ``mode``, else ``$LABKIT_SANDBOX``, else the best available."""
    mode = mode or os.environ.get("LABKIT_SANDBOX") or "auto"
    if mode not in MODES:
        raise ConfigError(f"sandbox mode ({mode!r}) must be one of {', '.join(MODES)}; "
                          "e.g. LABKIT_SANDBOX=bwrap")
    if mode == "auto":
        return next(m for m in ("bwrap", "unshare", "none") if available(m))
    if not available(mode):
        why = ("bwrap 0.8 or later is missing: apt-get install bubblewrap" if mode == "bwrap"
               else "user namespaces are disabled")
        raise ConfigError(f"sandbox mode {mode!r} does not work on this machine ({why}); "
                          "use LABKIT_SANDBOX=auto to fall back")
    return mode


def _needed_paths() -> list[Path]:
    """What Python and labkit need to run: interpreter, environment, the package, and any
    other site-packages folder on ``sys.path`` (an environment layered with a ``.pth``
    file); never another ``sys.path`` entry, which may be the course checkout itself."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), package_dir()}
    paths |= {Path(p).resolve() for p in sys.path
              if ("site-packages" in p or "dist-packages" in p) and Path(p).is_dir()}
    return sorted(paths)


def package_dir() -> Path:
    import labkit

    return Path(labkit.__file__).resolve().parent


def package_parent() -> str:
    return str(package_dir().parent)


BOX_PACKAGE = "/opt/labkit/labkit"
"""Where a bwrap box sees the labkit package (its parent, the course checkout, stays out)."""


def env(extra: Mapping[str, str], home: str, tmp: str) -> dict[str, str]:
    """A scrubbed environment: nothing of the grader's leaks in but what ranks need."""
    out = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "HOME": home, "TMPDIR": tmp, "LABKIT_HOME": f"{home}/.labkit",
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": f"{home}/.mpl", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo", "LABKIT_IN_BOX": "1",
           "LANG": "C.UTF-8"}
    # LD_LIBRARY_PATH: an interpreter whose libpython lives beside it, not where it was built
    for key in ("CUDA_VISIBLE_DEVICES", "LABKIT_TEST_TOKEN", "LD_LIBRARY_PATH"):
        if key in os.environ:
            out[key] = os.environ[key]
    out.update(extra)
    return out


def tool_env() -> dict[str, str]:
    """All that bwrap / unshare themselves get: they need no more, and whatever they hold
    could be read by a process that reaches them."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def init_argv(limits: Limits, package: str, server: list[str]) -> list[str]:
    """The box's first process (``boxinit``: rlimits, non-dumpable, reaper) running ``server``."""
    return [sys.executable, "-I", "-S", f"{package}/grading/sandbox/boxinit.py",
            json.dumps(limits.rlimits()), "--", *server]


def drop_capabilities(server: list[str]) -> list[str]:
    """``server`` started with no capability left (the ``unshare`` box maps the grader to
    root of its user namespace, which the box's own set-up needs and the student must not
    keep: with it, they could read the first process's memory or mount a larger /tmp)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return server
    return [setpriv, "--bounding-set", "-all", "--inh-caps", "-all", "--no-new-privs", *server]


def absent_views(absent: Sequence[str], packages: Sequence[str]) -> list[tuple[str, bool]]:
    """(path in the box, is a folder) of each absent labkit module, in every view of the package.

    ``absent`` names modules as ``labkit.theory`` / ``labkit.launchers.ray``; each one's
    folder becomes an empty read-only tmpfs holding only the stand-in ``__init__.py``
    (:mod:`absent`), a single-file module is replaced by the stand-in itself.
    """
    here = package_dir()
    out = []
    for name in absent:
        parts = name.split(".")
        if parts[0] != "labkit" or len(parts) < 2 or not all(p.isidentifier() for p in parts):
            raise ConfigError(f"absent module ({name!r}) must be a labkit module, "
                              "e.g. 'labkit.theory'")
        rel = Path(*parts[1:])
        if (here / rel).is_dir():
            out += [(f"{view}/{rel}", True) for view in packages]
        elif (here / rel).with_suffix(".py").is_file():
            out += [(f"{view}/{rel}.py", False) for view in packages]
    return out


def package_views_bwrap() -> list[str]:
    """Every place a bwrap box sees the labkit package: its own mount, and the original
    path when a bound environment holds it (a non-editable install in site-packages)."""
    here = package_dir()
    bound = [p for p in _needed_paths() if p != here] + [Path("/usr")]
    views = [BOX_PACKAGE]
    if any(p == here or p in here.parents for p in bound):
        views.append(str(here))
    return views


def bwrap_cmd(variables: Mapping[str, str], info_fd: int, limits: Limits,
              absent: Sequence[str] = (), network: bool = True) -> list[str]:
    """bwrap's command line, up to (not including) the command it runs."""
    tmp = str(limits.tmp_mb * MiB)
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user",
           "--disable-userns", "--as-pid-1", "--uid", str(NOBODY), "--gid", str(NOBODY),
           "--clearenv", "--info-fd", str(info_fd),
           "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
           "--ro-bind-try", "/sys", "/sys", "--size", tmp, "--tmpfs", "/tmp",
           "--size", tmp, "--tmpfs", "/dev/shm", "--dir", "/tmp/home"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = Path("/") / top
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), str(path)]
        elif path.exists():
            cmd += ["--ro-bind", str(path), str(path)]
    for name in ETC_FILES:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for path in _needed_paths():
        if path == package_dir():  # mounted on its own: its parent is the course checkout
            cmd += ["--ro-bind", str(path), BOX_PACKAGE]
        elif not str(path).startswith("/usr/"):
            cmd += ["--ro-bind", str(path), str(path)]
    stub = str(package_dir() / "grading" / "sandbox" / "absent.py")
    for view, folder in absent_views(absent, package_views_bwrap()):
        if folder:
            cmd += ["--size", "65536", "--tmpfs", view, "--ro-bind", stub, f"{view}/__init__.py",
                    "--remount-ro", view]
        else:
            cmd += ["--ro-bind", stub, view]
    for dev in sorted(Path("/dev").glob("nvidia*")) + [Path("/dev/dri")]:
        if dev.exists():  # one GPU per rank works in the box too (NCCL)
            cmd += ["--dev-bind", str(dev), str(dev)]
    if not network:  # a rank of a relayed exercise: not even a loopback to share
        cmd += ["--unshare-net"]
    variables = dict(variables, PYTHONPATH=str(Path(BOX_PACKAGE).parent))
    for key, value in variables.items():
        cmd += ["--setenv", key, value]
    # every lock of the host, by inode, is in /proc/locks; then the root (bwrap's own tmpfs,
    # as large as half the RAM: /, /opt/labkit, /etc, /root) and /dev go read-only, so the
    # sized /tmp and /dev/shm are all the box can write
    cmd += ["--ro-bind", "/dev/null", "/proc/locks", "--remount-ro", "/dev",
            "--remount-ro", "/"]
    return cmd + ["--chdir", "/tmp"]


def hidden_paths(course_root: Path | None) -> list[Path]:
    """Entries of the course root and of the home folder the box must not see."""
    keep = _needed_paths()
    out = []
    for parent in [p for p in (course_root, Path.home()) if p is not None and p.is_dir()]:
        for child in parent.iterdir():
            child = child.resolve() if not child.is_symlink() else child
            if not any(child == k or child in k.parents for k in keep):
                out.append(child)
    return out


PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
"""Replaced by empty, private mounts inside an ``unshare`` box."""


def under_private_tmp(path: Path) -> bool:
    """Whether ``path`` is (inside) one of ``PRIVATE_TMP``: it would vanish in the box."""
    resolved = path.resolve()
    return any(Path(d) == resolved or Path(d) in resolved.parents for d in PRIVATE_TMP)


def unshare_cmd(course_root: Path | None, limits: Limits | None = None,
                absent: Sequence[str] = ()) -> list[str]:
    """unshare's command line and the shell script that builds the box, up to the command."""
    limits = limits or Limits()
    inside = [str(p) for p in [*_needed_paths(), course_root]
              if p is not None and under_private_tmp(p)]
    if inside:
        raise ConfigError(f"the unshare sandbox gives the box an empty /tmp, /var/tmp and "
                          f"/dev/shm, so {', '.join(inside)} would vanish inside it: keep the "
                          f"course and its Python environment outside those folders, or "
                          f"install bubblewrap (apt-get install bubblewrap; LABKIT_SANDBOX=bwrap)")
    mounts = []
    for path in hidden_paths(course_root):
        if path.is_dir() and not path.is_symlink():
            mounts.append(f"mount -t tmpfs -o ro,size=4k none '{path}'")
        elif path.exists():
            mounts.append(f"mount --bind /dev/null '{path}'")
    stub = package_dir() / "grading" / "sandbox" / "absent.py"
    for view, folder in absent_views(absent, [str(package_dir())]):
        if folder:
            mounts += [f"mount -t tmpfs -o size=64k none '{view}'",
                       f"touch '{view}/__init__.py'",
                       f"mount --bind '{stub}' '{view}/__init__.py'",
                       f"mount -o remount,ro,size=64k none '{view}'"]
        else:
            mounts.append(f"mount --bind '{stub}' '{view}'")
    size = limits.tmp_mb * MiB
    script = "\n".join([
        "set -e",
        *mounts,
        # everything read-only (deepest first), /dev and /sys too (the grader's uid may own
        # files there: a box mapped to root could write the host's /dev); not /proc
        "for m in $(awk '{print $5}' /proc/self/mountinfo | sort -r); do",
        "  case \"$m\" in /proc*) ;;",
        "  *) mount -o remount,bind,ro \"$m\" 2>/dev/null || true;; esac",
        "done",
        f"for d in {' '.join(PRIVATE_TMP)}; do [ -d \"$d\" ] && mount -t tmpfs -o size={size} "
        "none \"$d\"; done",
        "mkdir -p /tmp/home", "mount --bind /dev/null /proc/locks", 'exec "$@"'])
    return ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork",
            "--kill-child", "--net", "--ipc", "--uts", "--mount-proc", "sh", "-c", script, "box"]
