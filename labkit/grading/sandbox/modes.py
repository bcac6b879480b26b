"""How the grading box is built: which sandbox this machine has, and its command line.

See :mod:`labkit.grading.sandbox.box` for what each mode protects. ``bwrap`` builds a new
root from read-only binds; ``unshare`` keeps the host's tree but remounts it read-only and
hides the course's and the home folder's entries under empty mounts; ``none`` only
scrubs the environment. Every mode gets the same clean environment (``env``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from labkit.base.errors import ConfigError

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
    if mode == "bwrap":
        return shutil.which("bwrap") is not None and _probe(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--unshare-user",
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
        why = ("bwrap is missing: apt-get install bubblewrap" if mode == "bwrap"
               else "user namespaces are disabled")
        raise ConfigError(f"sandbox mode {mode!r} does not work on this machine ({why}); "
                          "use LABKIT_SANDBOX=auto to fall back")
    return mode


def _needed_paths() -> list[Path]:
    """What Python and labkit need to run: interpreter, environment, the package."""
    import labkit

    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
             Path(labkit.__file__).resolve().parent}
    return sorted(paths)


def package_parent() -> str:
    import labkit

    return str(Path(labkit.__file__).resolve().parent.parent)


def env(extra: Mapping[str, str], home: str, tmp: str) -> dict[str, str]:
    """A scrubbed environment: nothing of the grader's leaks in but what ranks need."""
    out = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
           "HOME": home, "TMPDIR": tmp, "LABKIT_HOME": f"{home}/.labkit",
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": f"{home}/.mpl", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo", "LABKIT_IN_BOX": "1",
           "LANG": "C.UTF-8"}
    for key in ("CUDA_VISIBLE_DEVICES", "LABKIT_TEST_TOKEN"):
        if key in os.environ:
            out[key] = os.environ[key]
    out.update(extra)
    return out


def bwrap_cmd(variables: Mapping[str, str], info_fd: int) -> list[str]:
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user",
           "--uid", str(NOBODY), "--gid", str(NOBODY), "--clearenv", "--info-fd", str(info_fd),
           "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
           "--ro-bind-try", "/sys", "/sys", "--tmpfs", "/tmp", "--dir", "/tmp/home"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = Path("/") / top
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), str(path)]
        elif path.exists():
            cmd += ["--ro-bind", str(path), str(path)]
    for name in ETC_FILES:
        cmd += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for path in _needed_paths():
        if path.name == "labkit":  # mounted on its own: its parent is the course checkout
            cmd += ["--ro-bind", str(path), "/opt/labkit/labkit"]
        elif not str(path).startswith("/usr/"):
            cmd += ["--ro-bind", str(path), str(path)]
    for dev in sorted(Path("/dev").glob("nvidia*")) + [Path("/dev/dri")]:
        if dev.exists():  # one GPU per rank works in the box too (NCCL)
            cmd += ["--dev-bind", str(dev), str(dev)]
    variables = dict(variables, PYTHONPATH="/opt/labkit")
    for key, value in variables.items():
        cmd += ["--setenv", key, value]
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


def unshare_cmd(course_root: Path | None) -> list[str]:
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
    script = "\n".join([
        "set -e",
        # everything read-only (deepest first), except the kernel's own filesystems
        "for m in $(awk '{print $5}' /proc/self/mountinfo | sort -r); do",
        "  case \"$m\" in /proc*|/sys*|/dev*) ;;",
        "  *) mount -o remount,bind,ro \"$m\" 2>/dev/null || true;; esac",
        "done",
        f"for d in {' '.join(PRIVATE_TMP)}; do [ -d \"$d\" ] && mount -t tmpfs none \"$d\"; done",
        *mounts, "mkdir -p /tmp/home", 'exec "$@"'])
    return ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork",
            "--kill-child", "--net", "--ipc", "--uts", "--mount-proc", "sh", "-c", script, "box"]


