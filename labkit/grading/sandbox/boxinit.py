"""The first process of a grading box (its pid 1): limits, then the server, then reaping.

Runs as ``python -I -S boxinit.py LIMITS_JSON -- SERVER_ARGV...`` (standard library only:
it starts before anything of the student's, with no site-packages). It

1. brings the loopback interface up where the box asks for it (``unshare``: bubblewrap
   does it itself), then sets the per-process rlimits (``RLIMIT_NPROC`` here, *inside* the box's user
   namespace, counts the box's processes only: set outside, it would count every process
   of the grading user, see ``is_rlimit_overlimit`` in the kernel's ``ucount.c``);
2. makes itself non-dumpable (``PR_SET_DUMPABLE`` 0, prctl(2)): a process of the
   student's, with no capability in the box's user namespace, can then neither
   ``ptrace`` it nor read its ``/proc/1/environ``, ``mem`` or ``maps``. The student's own
   processes stay theirs to trace;
3. installs the seccomp filter (:mod:`seccomp`) that closes file locks, change notices
   and the other channels between boxes; the server and everything it starts inherit it;
4. starts the server (the student's interpreter) and reaps every process that ends in
   the box; when the server ends, it exits, and the kernel kills whatever is left in the
   box's pid namespace.

Without it bubblewrap's own reaper is pid 1, a copy of ``bwrap`` that holds the grader's
environment and that a student's process may attach to.
"""

import ctypes
import importlib.util
import json
import os
import resource
import sys

PR_SET_DUMPABLE = 4


def _limit(name: str, value: int) -> None:
    which = getattr(resource, f"RLIMIT_{name}")
    _, hard = resource.getrlimit(which)
    top = value + 5 if name == "CPU" else value
    if hard != resource.RLIM_INFINITY:
        top = min(top, hard)
    try:
        resource.setrlimit(which, (min(value, top), top))
    except (ValueError, OSError):
        pass


def loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (``unshare`` leaves it down; gloo
    ranks of one box talk over it)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14s", b"lo", 0, bytes(14))
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, bytes(14)))


def close_channels() -> None:
    """Install the seccomp filter, loaded by path (``-I``: no package on ``sys.path``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("box_seccomp", f"{here}/seccomp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    why = module.install()
    if why:
        print(f"labkit box: {why}", file=sys.stderr)


def main(argv: list[str]) -> int:
    limits, command = json.loads(argv[0]), argv[2:]
    if os.environ.pop("LABKIT_BOX_LO_UP", "0") == "1":
        loopback_up()
    for name, value in limits.items():
        _limit(name, int(value))
    # before the fork: the server's exec makes it dumpable again (it is the student's)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    close_channels()
    server = os.fork()
    if server == 0:
        os.execv(command[0], command)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if pid == server:
            return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
