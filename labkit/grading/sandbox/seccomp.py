"""A seccomp filter that closes the channels between boxes a grading answer has no use for.

Namespaces give each box its own processes, network, SysV IPC and ``/tmp``; they do not
give it its own files. Every box (and the student's live kernel) opens the same read-only
files under ``/usr``, and the kernel keeps a few kinds of state *per file*, not per mount
or per namespace, that any opener can set and any other opener can read:

* **advisory locks** (``flock``, ``fcntl`` ``F_SETLK`` / ``F_GETLK`` and the open-file-
  description ``F_OFD_*`` ones) -- a lock is a bit one box sets and another tests, so ranks
  of ps3 in separate boxes could pass a whole all-gather through a handful of files;
* **leases and change notices** (``F_SETLEASE``, ``F_NOTIFY``, inotify, fanotify) -- one
  box reading a file is an event another box can wait for;
* **page-cache residency** (``mincore``) -- whether a cold file's page is cached says
  whether someone read it;
* **kernel keyrings** (``add_key`` / ``keyctl``) and, where no IPC namespace separates the
  boxes (mode ``none``), SysV IPC and POSIX message queues.

This module writes a classic-BPF program (``seccomp(2)``, ``SECCOMP_MODE_FILTER``; the
instruction set of the kernel's ``Documentation/networking/filter.rst``) that makes those
calls harmless: a lock request *succeeds without locking anything* (code that locks a file
for its own ranks keeps working; no process can learn from a lock whether another holds
one), a lock query, a lease or a notice fails with ``ENOLCK``, and the other calls fail
with ``ENOSYS`` (not available here), which libraries treat as "use another way". A call
made with another architecture's numbers (``int 0x80`` on x86-64, the x32 ABI) fails with
``ENOSYS`` too, so the numbers cannot be dodged. ``/proc/locks`` (every lock of the host,
by device and inode) is masked by the box itself (:mod:`modes`).

Standard library only: the box's first process (:mod:`boxinit`) loads this file by path
and installs the filter before the student's interpreter starts; every process of the box
inherits it and cannot remove it (``PR_SET_NO_NEW_PRIVS`` is set first, as the kernel
requires). Only x86-64 and AArch64 are known here; elsewhere :func:`program` returns
None and the box runs without the filter (:func:`install` says so).

What it cannot close: timing (CPU load, cache contention) between processes that share a
machine. A box is graded on what its answer computes, so such a channel would have to
carry the answer itself, slowly and noisily, past the per-cell CPU limits.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct
import sys

# classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
NR_OFFSET, ARCH_OFFSET, ARG1_OFFSET = 0, 4, 24  # struct seccomp_data; args[1], low word
X32_BIT = 0x40000000

ARCHES = {  # platform.machine() -> (AUDIT_ARCH_*, {call: number}) from each unistd.h
    "x86_64": (0xC000003E, {
        "flock": 73, "fcntl": 72, "inotify_init": 253, "inotify_init1": 294,
        "inotify_add_watch": 254, "fanotify_init": 300, "mincore": 27, "msgget": 68,
        "semget": 64, "shmget": 29, "mq_open": 240, "add_key": 248, "request_key": 249,
        "keyctl": 250}),
    "aarch64": (0xC00000B7, {
        "flock": 32, "fcntl": 25, "inotify_init1": 26, "inotify_add_watch": 27,
        "fanotify_init": 262, "mincore": 232, "msgget": 186, "semget": 190, "shmget": 194,
        "mq_open": 180, "add_key": 217, "request_key": 218, "keyctl": 219}),
}
ARCHES["arm64"] = ARCHES["aarch64"]

GRANTED = ("flock",)
"""Calls that succeed and do nothing: a lock that holds nothing and tells nothing."""
F_GRANTED = (6, 7, 13, 14, 37, 38)  # F_SETLK, F_SETLKW, F_SETLK64, F_SETLKW64, F_OFD_SETLK(W)
F_REFUSED = (5, 12, 36, 1024, 1025, 1026)  # F_GETLK(64), F_OFD_GETLK, F_{SET,GET}LEASE, F_NOTIFY


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one) as packed ``struct sock_filter``
    entries, or None where this module does not know the system call numbers."""
    arch = ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit, numbers = arch
    code: list[tuple[int, str | int, str | int, int]] = []  # (op, true, false, k), labels
    code.append((LD_W_ABS, 0, 0, ARCH_OFFSET))
    code.append((JEQ_K, 0, "enosys", audit))
    code.append((LD_W_ABS, 0, 0, NR_OFFSET))
    if audit == ARCHES["x86_64"][0]:
        code.append((JGE_K, "enosys", 0, X32_BIT))
    code.append((JEQ_K, "fcntl", 0, numbers["fcntl"]))
    for name in GRANTED:
        code.append((JEQ_K, "granted", 0, numbers[name]))
    for name, number in numbers.items():
        if name not in GRANTED and name != "fcntl":
            code.append((JEQ_K, "enosys", 0, number))
    code.append((RET_K, 0, 0, RET_ALLOW))
    labels = {"fcntl": len(code)}
    code.append((LD_W_ABS, 0, 0, ARG1_OFFSET))
    code += [(JEQ_K, "granted", 0, cmd) for cmd in F_GRANTED]
    code += [(JEQ_K, "enolck", 0, cmd) for cmd in F_REFUSED]
    code.append((RET_K, 0, 0, RET_ALLOW))
    for label, value in (("granted", RET_ERRNO), ("enolck", RET_ERRNO | errno.ENOLCK),
                         ("enosys", RET_ERRNO | errno.ENOSYS)):
        labels[label] = len(code)
        code.append((RET_K, 0, 0, value))
    out = b""
    for at, (op, true, false, k) in enumerate(code):
        jt, jf = (labels[j] - at - 1 if isinstance(j, str) else j for j in (true, false))
        out += struct.pack("=HBBI", op, jt, jf, k)
    return out


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def install(machine: str | None = None) -> str | None:
    """Install :func:`program` on the calling process (and all it will start); returns
    None when installed, else why not (an unknown architecture, a kernel without seccomp)."""
    code = program(machine) if sys.platform.startswith("linux") else None
    if code is None:
        return (f"no seccomp filter for {machine or platform.machine()}: file locks and "
                "change notices stay shared with other boxes")
    libc = ctypes.CDLL(None, use_errno=True)
    prog = _Program(len(code) // 8, code)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        return f"seccomp filter refused: {errno.errorcode.get(ctypes.get_errno(), '?')}"
    return None
