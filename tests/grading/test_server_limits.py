"""Student servers with limits (issue 35, item 9), without a hub: two students' processes
started the way ``LimitedSpawner`` starts a server (its first step joins the server's
cgroup, then becomes the student).

``nobody`` runs a fork bomb and a memory hog at once; ``daemon``'s "kernel" (a process that
answers each line it reads) must keep answering. The bomb meets ``pids.max`` and the hog the
OOM killer inside nobody's cgroup; without the cgroups (LocalProcessSpawner) both would hit
the whole machine. Where no cgroup can be made the rlimits fallback is checked instead.
Needs root and the system's ``/usr/bin/python3`` (one every user can run).
"""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from labkit.grading.spawner import ServerLimits, clear

pytestmark = [pytest.mark.lesson08,
              pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                                 reason="starts processes as two users: root")]
PYTHON = "/usr/bin/python3"
KERNEL = ("import sys\nfor n, line in enumerate(sys.stdin):\n"
          "    print('alive', n, flush=True)\n")
RUNAWAY = """
import os, threading, time
def hog():
    chunks = []
    while True:
        chunks.append(bytearray(32 << 20))  # zero-filled: every page touched
if os.fork() == 0:
    hog()
time.sleep(0.5)
while True:  # every process forks again: a fork bomb
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
"""


def become(user: str) -> Callable[[], None]:
    info = pwd.getpwnam(user)

    def step() -> None:
        os.setgroups([])
        os.setgid(info.pw_gid)
        os.setuid(info.pw_uid)

    return step


@pytest.fixture()
def limits() -> Iterator[ServerLimits]:
    parent = f"/labkit-test-users-{secrets.token_hex(3)}"
    yield ServerLimits(memory_mb=160, processes=40, parent=parent)
    for mount in Path("/sys/fs/cgroup").iterdir():
        for folder in sorted(mount.glob(f"{parent.strip('/')}/*"), reverse=True) + \
                [mount / parent.strip("/")]:
            if folder.is_dir():
                folder.rmdir()


def test_a_fork_bomb_and_a_memory_hog_leave_another_students_kernel_running(
        limits: ServerLimits) -> None:
    victim, attacker = limits.cgroup("daemon"), limits.cgroup("nobody")
    if victim is None or attacker is None:
        pytest.skip("no cgroup with pids and memory can be made here")
    kernel = subprocess.Popen([PYTHON, "-c", KERNEL], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd="/",
                              preexec_fn=limits.preexec(victim, become("daemon")))
    runaway = subprocess.Popen([PYTHON, "-c", RUNAWAY], cwd="/", stderr=subprocess.DEVNULL,
                               preexec_fn=limits.preexec(attacker, become("nobody")))
    try:
        assert kernel.stdin is not None and kernel.stdout is not None
        deadline = time.monotonic() + 120
        while attacker.events()["pids"] == 0 or attacker.events()["oom"] == 0:
            assert time.monotonic() < deadline, attacker.events()
            time.sleep(0.2)
        for n in range(3):  # the attack is still on: the other kernel answers
            kernel.stdin.write("ping\n")
            kernel.stdin.flush()
            assert kernel.stdout.readline() == f"alive {n}\n"
        assert len(attacker.pids()) <= limits.processes
        assert kernel.poll() is None
    finally:
        killed = clear(attacker)
        clear(victim)
        runaway.wait(10)
        kernel.wait(10)
    assert killed > 0 and attacker.pids() == []


def test_without_a_cgroup_the_rlimits_hold_instead() -> None:
    limits = ServerLimits(memory_mb=256, processes=64)
    proc = subprocess.Popen([PYTHON, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE, cwd="/",
                            preexec_fn=limits.preexec(None, become("nobody")))
    try:
        text = Path(f"/proc/{proc.pid}/limits").read_text()
        assert any(line.startswith("Max processes") and line.split()[2] == "64"
                   for line in text.splitlines()), text
        assert any(line.startswith("Max data size") and line.split()[3] == str(256 << 20)
                   for line in text.splitlines()), text
    finally:
        proc.communicate("")


def test_limits_are_checked_before_any_server_starts() -> None:
    from labkit.base.errors import ConfigError

    with pytest.raises(ConfigError, match=r"memory_mb \(8\)"):
        ServerLimits(memory_mb=8)
    with pytest.raises(ConfigError, match=r"parent \('users'\) must be an absolute"):
        ServerLimits(parent="users")


def test_the_hubs_spawner_puts_the_server_in_its_cgroup_as_the_student(
        limits: ServerLimits) -> None:
    """``LimitedSpawner``'s first step (JupyterHub calls ``make_preexec_fn``): the server
    runs as the student, inside a pids and memory cgroup under ``cgroup_parent``."""
    from labkit.grading.spawner import LimitedSpawner

    spawner = LimitedSpawner(mem_limit="200M", pids_limit=40, cgroup_parent=limits.parent)
    first_step = spawner.make_preexec_fn("nobody")
    if spawner._cgroup is None:
        pytest.skip("no cgroup with pids and memory can be made here")
    proc = subprocess.run([PYTHON, "-c", "import os; print(os.getuid()); "
                           "print(open('/proc/self/cgroup').read())"], cwd="/", text=True,
                          capture_output=True, preexec_fn=first_step, timeout=60, check=True)
    uid, groups = proc.stdout.split("\n", 1)
    assert int(uid) == pwd.getpwnam("nobody").pw_uid
    for controller in ("pids", "memory"):
        line = next(ln for ln in groups.splitlines() if f":{controller}:" in ln)
        assert line.split(":", 2)[2].startswith(f"{limits.parent}/nobody/labkit-box-"), groups
    folder = next(d for d in spawner._cgroup.dirs if "memory" in str(d))
    assert (folder / "memory.limit_in_bytes").read_text().strip() == str(200 * 2**20)
    clear(spawner._cgroup)
