"""What the class test needs besides JupyterHub: an interpreter everyone can run, throwaway
users, free ports, commands run as a user, a hub process that always goes away.

A class runs its servers as the students, so their Python must be one every user can run.
The project's environment may sit in a folder only root can enter (a pyenv under
``/root``); :func:`class_python` then copies that interpreter's standard library to a
world-readable folder and layers a venv on the running environment's site-packages (a
``.pth`` file): the same packages, runnable by everyone, nothing downloaded.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

LIB = f"python{sys.version_info.major}.{sys.version_info.minor}"


def open_to_all(path: Path) -> bool:
    """Can every user reach and read ``path`` (every folder on the way searchable)?"""
    path = path.resolve()
    for folder in path.parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(path.stat().st_mode & stat.S_IROTH)


def class_python(base: Path) -> tuple[str, dict[str, str]]:
    """A venv every user can run with the running environment's packages: (python, env)."""
    home, env = Path(sys.base_prefix), {}
    if not open_to_all(home / "lib" / LIB / "os.py"):
        copy = base / "python"
        shutil.copytree(home, copy, symlinks=True, ignore=shutil.ignore_patterns(
            "site-packages", "test", "tests", "idle_test", "config-*", "*.a"))
        home, env["LD_LIBRARY_PATH"] = copy, str(copy / "lib")  # libpython beside the copy
    venv = base / "venv"
    subprocess.run([str(home / "bin" / LIB), "-m", "venv", "--without-pip", str(venv)],
                   check=True, env={**os.environ, **env}, timeout=120)
    sites = [p for p in sys.path if ("site-packages" in p or "dist-packages" in p)
             and Path(p).is_dir()]
    assert all(open_to_all(Path(p)) for p in sites), f"site-packages others cannot read: {sites}"
    (venv / "lib" / LIB / "site-packages" / "labkit-class.pth").write_text("\n".join(sites))
    for sub in ("share/jupyter", "etc/jupyter"):  # lab extensions, server extensions' config
        if (Path(sys.prefix) / sub).is_dir():
            (venv / sub).parent.mkdir(parents=True, exist_ok=True)
            (venv / sub).symlink_to(Path(sys.prefix) / sub)
    alembic = venv / "bin" / "alembic"  # nbgrader runs it by name for a new gradebook
    alembic.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom alembic.config import "
                       "main\nsys.exit(main())\n")
    alembic.chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True, timeout=120)
    return str(venv / "bin" / "python"), env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Users:
    """Throwaway users of one test: an instructor and students, with random passwords."""

    prefix: str
    students: int
    names: list[str] = field(default_factory=list)
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def instructor(self) -> str:
        return self.names[0]

    @property
    def student_names(self) -> list[str]:
        return self.names[1:]

    def plan(self) -> None:
        self.names = [f"{self.prefix}i"] + [f"{self.prefix}s{k}" for k in range(self.students)]
        self.passwords = {n: secrets.token_urlsafe(12) for n in self.names}

    def uids(self) -> list[int]:
        out = []
        for name in self.names:
            try:
                out.append(pwd.getpwnam(name).pw_uid)
            except KeyError:
                continue
        return out

    def processes(self, uids: list[int] | None = None) -> list[int]:
        """Live processes of these users (their servers, kernels, ranks, boxes)."""
        wanted = set(uids if uids is not None else self.uids())
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}").st_uid in wanted:
                        out.append(int(entry))
                except OSError:
                    continue
        return out

    def remove(self) -> list[int]:
        """Kill what these users still run (by pid), delete them and their homes; the uids."""
        uids = self.uids()
        for _ in range(3):
            for pid in self.processes(uids):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
            time.sleep(0.3)
        for name in self.names:
            userdel = shutil.which("userdel", path="/usr/sbin:/sbin:/usr/bin:/bin")
            subprocess.run([userdel or "userdel", "--remove", name], capture_output=True,
                           timeout=60, check=False)
        # what their kernels left in the shared temp dir (torch's torchinductor_<user>)
        tmp = Path(tempfile.gettempdir())
        for entry in tmp.iterdir():
            with contextlib.suppress(OSError):
                if entry.lstat().st_uid in uids and entry.lstat().st_uid != 0:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink()
        return uids


def as_user(user: str, args: list[str], env: dict[str, str], cwd: str | Path,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``args`` as ``user`` (runuser) with exactly ``env``."""
    runuser = shutil.which("runuser", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    return subprocess.run([runuser or "runuser", "-u", user, "--", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def stop(proc: subprocess.Popen[bytes] | None, wait_s: float = 30) -> None:
    """Stop a process started in its own session: SIGTERM to its group, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, wait_s), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
