"""What students actually do to the supervisor (issue 14), on real ranks: return tensors,
exit 0 without a word, press stop during start-up (twice), run out of file descriptors,
fork and daemonize, kill the notebook kernel. Each test checks that the caller gets the
right answer or the right rank's failure, and that no process and no temp dir survive.

Every test runs twice: with ranks forked by the fork server (``labkit.launchers.forkserver``, the
default) and with ranks exec'd as plain subprocesses (``LABKIT_FORKSERVER=0``)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import labkit
from labkit.base.errors import RunFailed

pytestmark = [pytest.mark.distributed, pytest.mark.lesson00, pytest.mark.timeout(120)]


@pytest.fixture(autouse=True, params=["fork", "exec"])
def start(request, monkeypatch) -> str:
    """How ranks start: forked by the fork server, or exec'd (the server switched off)."""
    if request.param == "exec":
        monkeypatch.setenv("LABKIT_FORKSERVER", "0")
    return str(request.param)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# ---- 1. results travel by value ------------------------------------------------------------

def test_launch_returns_tensors_small_and_large(contained) -> None:
    """A tensor (3 floats, and 16 M floats = 64 MB) comes back whole from every rank."""
    import torch

    def tensors(ctx):
        import torch

        return torch.ones(3) * ctx.rank, torch.full((16_000_000,), float(ctx.rank + 1))

    res = labkit.launch(tensors, 2, timeout_s=60)
    for rank, (small, big) in enumerate(res.results):
        assert torch.equal(small, torch.ones(3) * rank), f"rank {rank}: {small}"
        assert big.shape == (16_000_000,) and float(big.min()) == float(big.max()) == rank + 1


def test_a_result_the_parent_cannot_rebuild_is_that_ranks_failure(contained) -> None:
    """Pickled fine on the rank, fails to unpickle in the supervisor: rank 1 is named, kind
    'result', with the reason -- never silence until the timeout."""
    def explode():
        raise RuntimeError("cannot be rebuilt here")

    class Bomb:
        def __reduce__(self):
            return (explode, ())

    def returns_bomb(ctx):
        return Bomb() if ctx.rank == 1 else "fine"

    with pytest.raises(RunFailed) as err:
        labkit.launch(returns_bomb, 2, timeout_s=60)
    # kind "result", not "timeout": reported when it happened, not found at the timeout
    assert (err.value.rank, err.value.kind) == (1, "result"), str(err.value)
    assert "cannot be rebuilt here" in err.value.failure.message


def test_a_result_that_cannot_be_pickled_names_the_rank_and_the_rule(contained) -> None:
    def returns_lock(ctx):
        return threading.Lock()

    with pytest.raises(RunFailed) as err:
        labkit.launch(returns_lock, 2, timeout_s=60)
    assert err.value.kind == "exception"
    assert "cannot be sent to the supervisor" in err.value.failure.message
    assert "return plain values, numpy arrays or tensors" in err.value.failure.message


# ---- 2. a silent exit 0 ---------------------------------------------------------------------

@pytest.mark.parametrize("when", ["before_comm", "peer_in_all_reduce"])
def test_silent_exit_0_is_that_ranks_failure(contained, when: str) -> None:
    """os._exit(0) on rank 1 is rank 1's failure (kind exit), found when it happens -- not
    at the timeout, and not blamed on rank 0's 'connection reset' echo."""
    def quits(ctx, when):
        import os

        import torch

        if ctx.rank == 1:
            if when == "peer_in_all_reduce":
                time.sleep(0.5)  # rank 0 is blocked in the all-reduce by now
            os._exit(0)
        ctx.comm.all_reduce(torch.ones(1))
        return "rank 0 done"

    with pytest.raises(RunFailed) as err:
        labkit.launch(quits, 2, when, timeout_s=60)
    # kind "exit", not "timeout": found when it happened (no wall-clock bound: issue 25)
    assert (err.value.rank, err.value.kind) == (1, "exit"), str(err.value)
    assert "exited with code 0 without reporting its result" in err.value.failure.message


# ---- 3. interrupts and failures during start-up ---------------------------------------------

def _sleepy(ctx):
    time.sleep(60)


def test_interrupts_at_random_points_of_start_up_leave_nothing(contained) -> None:
    """Ctrl-C 0-300 ms into labkit.launch (while ranks are being spawned and importing):
    every trial raises KeyboardInterrupt and leaves no process and no temp dir."""
    main = threading.main_thread().ident
    assert main is not None
    rng = random.Random(14)
    for delay in [0.0, 0.3] + [rng.uniform(0, 0.3) for _ in range(6)]:
        go = threading.Event()

        def press_stop(delay: float = delay, go: threading.Event = go) -> None:
            go.wait()
            time.sleep(delay)
            signal.pthread_kill(main, signal.SIGINT)

        presser = threading.Thread(target=press_stop)
        presser.start()
        with pytest.raises(KeyboardInterrupt):
            go.set()  # the clock starts as launch is called
            labkit.launch(_sleepy, 3, timeout_s=60)
        presser.join()
        assert contained.processes() == [], f"ranks survived an interrupt at {delay:.3f} s"
        assert contained.temp_entries() == [], f"temp dir survived an interrupt at {delay:.3f} s"


def test_a_second_interrupt_during_shutdown_still_cleans_up(contained, tmp_path: Path) -> None:
    """Ranks that ignore SIGTERM make shutdown wait its grace period; a second Ctrl-C then
    cuts the wait short, and still every rank is killed and the temp dir removed."""
    ready = tmp_path / "ready"
    ready.mkdir()

    def stubborn(ctx, ready):
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(f"{ready}/{ctx.rank}", "w").close()
        time.sleep(60)

    main = threading.main_thread().ident
    assert main is not None

    def press_stop_twice() -> None:
        deadline = time.monotonic() + 60
        while len(os.listdir(ready)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        signal.pthread_kill(main, signal.SIGINT)  # stop: shutdown starts its SIGTERM grace
        time.sleep(0.5)
        signal.pthread_kill(main, signal.SIGINT)  # stop again, during the grace

    presser = threading.Thread(target=press_stop_twice)
    presser.start()
    with pytest.raises(KeyboardInterrupt):
        labkit.launch(stubborn, 2, str(ready), timeout_s=90)
    presser.join()
    contained.assert_clean()


def test_a_failed_spawn_stops_the_ranks_already_started(contained, monkeypatch,
                                                       start: str) -> None:
    """Starting rank 2 of 4 fails with EMFILE (in Popen, or in the fork server's spawn): a
    clear error naming rank 2, and ranks 0-1 (already started) are gone, with the temp dir."""
    import errno

    from labkit.launchers import forkserver, supervisor
    owner, name = ((supervisor.subprocess, "Popen") if start == "exec"
                   else (forkserver.Client, "spawn"))
    real, calls = getattr(owner, name), []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
    with pytest.raises(RunFailed) as err:
        labkit.launch(_sleepy, 4, timeout_s=60)
    assert (err.value.rank, err.value.kind) == (2, "start"), str(err.value)
    assert "Too many open files" in err.value.failure.message
    assert "2 rank(s) started were stopped" in err.value.failure.message
    contained.assert_clean()


# ---- 4. ranks that fork -----------------------------------------------------------------------

def _fork_and_daemonize(ctx, fail: bool):
    """A plain fork and a setsid double-fork daemon, both ignoring SIGTERM; returns pids."""
    import os
    import signal
    import time

    def linger() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)

    child = os.fork()
    if child == 0:
        linger()
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()  # leaves the rank's process group and session
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode().ljust(16))
            linger()
        os._exit(0)
    os.waitpid(middle, 0)
    daemon = int(os.read(read, 16))
    Path(os.environ["PIDS_DIR"], f"{ctx.rank}").write_text(f"{child} {daemon}")
    if fail and ctx.rank == 1:
        raise RuntimeError("rank 1 fails after forking")
    return [child, daemon]


@pytest.mark.parametrize("fail", [False, True])
def test_forks_and_daemons_of_a_rank_die_with_the_run(contained, monkeypatch, tmp_path: Path,
                                                      fail: bool) -> None:
    """Whether the run succeeds or a rank fails, a rank's fork and its setsid daemon (both
    ignoring SIGTERM) are gone when launch returns."""
    monkeypatch.setenv("PIDS_DIR", str(tmp_path))
    if fail:
        with pytest.raises(RunFailed):
            labkit.launch(_fork_and_daemonize, 2, fail, timeout_s=60)
    else:
        labkit.launch(_fork_and_daemonize, 2, fail, timeout_s=60)
    pids = [int(p) for f in tmp_path.glob("[0-9]") for p in f.read_text().split()]
    assert len(pids) == 4
    assert [p for p in pids if _alive(p)] == []
    contained.assert_clean()


# ---- ranks still die with their parent ----------------------------------------------------

def test_ranks_die_when_the_parent_is_killed(contained, tmp_path: Path, start: str) -> None:
    """Each rank has its own session now; the parent-death signal must still take it down
    when the kernel running labkit is killed (kill -9, "Restart kernel"). Forked ranks go
    with their fork server, which goes with the kernel."""
    from labkit.launchers.reaper import FORKSERVER_ENV, tagged

    ready = tmp_path / "ready"
    ready.mkdir()
    script = ("import time, labkit\n"
              "def wait(ctx, ready):\n"
              "    open(f'{ready}/{ctx.rank}', 'w').close()\n"
              "    time.sleep(60)\n"
              f"labkit.launch(wait, 2, {str(ready)!r}, timeout_s=90)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(ready)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(contained.processes()) >= 3  # the parent and its two ranks
        served = tagged(FORKSERVER_ENV, str(parent.pid))  # its fork server and what it forked
        assert len(served) == (3 if start == "fork" else 0), served
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while (contained.processes() or tagged(FORKSERVER_ENV, str(parent.pid))) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert contained.processes() == []
        assert tagged(FORKSERVER_ENV, str(parent.pid)) == [], "the fork server survived"
    finally:
        parent.kill()
        parent.wait()
    # the killed parent could not remove its run directory: that is the one leftover
    leftovers = contained.temp_entries()
    assert all(e.startswith("labkit-run-") for e in leftovers), leftovers
    for e in leftovers:
        import shutil

        shutil.rmtree(contained.tmpdir / e)
