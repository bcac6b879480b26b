"""Boxes that cannot talk, and a box that cannot write but its own /tmp (issue 35, items 4, 6).

Each test is an attack first: a value passed between two boxes, or from a process outside
any box into one, through state the kernel keeps per file (advisory locks on a read-only
file under ``/usr``, ``/proc/locks``, change notices), or a write outside ``/tmp``. Each
reads what the receiving box sees with the sender on and with it off: the two must be
equal, so nothing crossed. Controls: a lock inside one box still works for that box's own
code (it is granted), and ``/tmp`` stays writable.
"""

from __future__ import annotations

import fcntl
import struct
import uuid
from pathlib import Path

import pytest

from labkit.grading.sandbox import box as boxes
from labkit.grading.sandbox import seccomp
from labkit.grading.sandbox.limits import Limits, MiB
from labkit.grading.sandbox.modes import under_private_tmp
from labkit.grading.sandbox.remote import Session

pytestmark = [pytest.mark.grading, pytest.mark.lesson08]
REPO = Path(__file__).resolve().parents[2]
SHARED = "/usr/bin/env"  # read-only in every box, and open to every user of the host
MODES = [pytest.param(m, marks=pytest.mark.skipif(
    m == "unshare" and under_private_tmp(REPO), reason="the unshare box hides the checkout"))
    for m in ("bwrap", "unshare", "none") if boxes.available(m)]
ISOLATING = [m for m in MODES if m.values[0] != "none"]
LIMITS = Limits(tmp_mb=24)  # not the default: the size must be the box's own

HOLD = f"""import fcntl, struct
_held = [open({SHARED!r}, 'rb') for _ in range(3)]
for how, h in zip(('flock', 'posix', 'ofd'), _held):
    try:
        if how == 'flock':
            fcntl.flock(h, fcntl.LOCK_EX)
        else:
            cmd = fcntl.F_SETLK if how == 'posix' else 37  # F_OFD_SETLK
            fcntl.fcntl(h, cmd, struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0))
        print('held', how)
    except OSError as exc:
        print('refused', how, exc.errno)
"""

PROBE = f"""import fcntl, struct
seen = []
with open({SHARED!r}, 'rb') as h:
    try:
        fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)
        seen.append('flock:free')
        fcntl.flock(h, fcntl.LOCK_UN)
    except OSError as exc:
        seen.append(f'flock:{{exc.errno}}')
    for name, cmd in (('getlk', fcntl.F_GETLK), ('ofd_getlk', 36)):
        try:
            got = fcntl.fcntl(h, cmd, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))
            seen.append(f'{{name}}:{{struct.unpack("hhqqi", got)[0]}}')
        except OSError as exc:
            seen.append(f'{{name}}:{{exc.errno}}')
try:  # the shared file's locks only: in mode none every other lock of the host shows too
    import os
    ino = os.stat({SHARED!r}).st_ino
    mine = f':{{ino}} '
    seen.append('proc_locks:' + str(sum(mine in x for x in open('/proc/locks'))))
except OSError as exc:
    seen.append(f'proc_locks:{{exc.errno}}')
print('SEEN', ' '.join(seen))
"""


def seen(session: Session) -> str:
    reply = session.run_cell(PROBE)
    line = [x for x in reply.get("stdout", "").splitlines() if x.startswith("SEEN")]
    assert line, reply
    return line[0]


@pytest.mark.parametrize("mode", MODES)
def test_a_lock_held_in_one_box_is_not_seen_in_another(mode: str) -> None:
    sender = Session(mode=mode, course_root=REPO, cell_timeout=30).start()
    receiver = Session(mode=mode, course_root=REPO, cell_timeout=30).start()
    try:
        quiet = seen(receiver)
        held = sender.run_cell(HOLD)
        assert "held flock" in held["stdout"], held  # granted: the box's own code still runs
        assert seen(receiver) == quiet, "a lock in one box reached the other"
    finally:
        sender.close()
        receiver.close()


@pytest.mark.parametrize("mode", ISOLATING)
def test_a_lock_held_outside_any_box_is_not_seen_inside(mode: str) -> None:
    receiver = Session(mode=mode, course_root=REPO, cell_timeout=30).start()
    handles = [open(SHARED, "rb") for _ in range(2)]  # noqa: SIM115 - held across the probe
    try:
        quiet = seen(receiver)
        fcntl.flock(handles[0], fcntl.LOCK_EX)
        fcntl.fcntl(handles[1], fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0))
        assert seen(receiver) == quiet, "a lock outside the box reached it"
    finally:
        for handle in handles:
            handle.close()
        receiver.close()


NOTICE_SETUP = f"""import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
_fd = libc.inotify_init1(os.O_NONBLOCK)
print('inotify', _fd, ctypes.get_errno())
if _fd >= 0:
    print('watch', libc.inotify_add_watch(_fd, {SHARED.encode()!r}, 0x1))  # IN_ACCESS
"""
NOTICE_READ = """try:
    print('events', len(os.read(_fd, 4096)) if _fd >= 0 else 'none')
except BlockingIOError:
    print('events 0')
"""


@pytest.mark.parametrize("mode", MODES)
def test_reading_a_shared_file_is_no_event_in_a_box(mode: str) -> None:
    receiver = Session(mode=mode, course_root=REPO, cell_timeout=30).start()
    try:
        receiver.run_cell(NOTICE_SETUP)
        Path(SHARED).read_bytes()  # the sender: any process, in a box or not
        reply = receiver.run_cell(NOTICE_READ)
        assert "events none" in reply["stdout"], reply
    finally:
        receiver.close()


PLACES = ("/", "/opt/labkit/", "/opt/", "/etc/", "/root/", "/dev/", "/dev/mqueue/", "/usr/",
          "/tmp/", "/dev/shm/")
WRITES = """import os, sys
for path in [place + sys.argv[0] for place in PLACES]:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write('x')
        print('WROTE', path)
    except OSError as exc:
        print('NO', path, exc.errno)
for place in ('/tmp', '/dev/shm'):
    st = os.statvfs(place)
    print('SIZE', place, st.f_blocks * st.f_frsize)
"""


@pytest.mark.parametrize("mode", ISOLATING)
def test_the_box_writes_only_its_own_sized_tmp(mode: str) -> None:
    name = f"labkit-probe-{uuid.uuid4().hex}"
    session = Session(mode=mode, course_root=REPO, cell_timeout=30, limits=LIMITS).start()
    try:
        out = session.run_cell(f"import sys; sys.argv = [{name!r}]; PLACES = {PLACES!r}\n"
                               + WRITES)["stdout"]
    finally:
        session.close()
        escaped = [place for place in PLACES if Path(place, name).exists()]
        for place in escaped:  # the box wrote into the host's tree: undo it
            Path(place, name).unlink()
    wrote = {line.split()[1] for line in out.splitlines() if line.startswith("WROTE")}
    assert wrote == {f"/tmp/{name}", f"/dev/shm/{name}"}, out
    assert escaped == [], f"written on the host: {escaped}"
    sizes = {line.split()[1]: int(line.split()[2]) for line in out.splitlines()
             if line.startswith("SIZE")}
    assert sizes == {"/tmp": LIMITS.tmp_mb * MiB, "/dev/shm": LIMITS.tmp_mb * MiB}, out


def test_the_filter_is_classic_bpf_for_each_known_arch_and_none_elsewhere() -> None:
    for machine in ("x86_64", "aarch64"):
        code = seccomp.program(machine)
        assert code is not None and len(code) % 8 == 0 and len(code) // 8 < 256
        ops = [struct.unpack_from("=HBBI", code, i)[0] for i in range(0, len(code), 8)]
        assert ops[0] == seccomp.LD_W_ABS and ops[-1] == seccomp.RET_K
    assert seccomp.program("riscv64") is None
    assert "riscv64" in (seccomp.install("riscv64") or "")
