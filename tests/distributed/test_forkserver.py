"""Ranks forked by the fork server (``labkit.launchers.forkserver``) are the ranks an exec would start:
the caller's environment, directory and temp dir as of each run, the same weights, and the
same cleanup -- also when the server is killed. (A killed caller, and everything else the
supervisor promises, is in ``test_supervisor_hardening.py``, which runs forked and exec'd.)"""

from __future__ import annotations

import os
import time

import pytest

import labkit
from labkit.base.errors import RunFailed
from labkit.launchers import forkserver

pytestmark = [pytest.mark.distributed, pytest.mark.lesson00, pytest.mark.timeout(120)]


def _where(ctx):
    import os
    import tempfile

    return {"ppid": os.getppid(), "cwd": os.getcwd(), "tmp": tempfile.gettempdir(),
            "flavour": os.environ.get("LAB_FLAVOUR"), "pgid": os.getpgid(0), "pid": os.getpid()}


def test_a_forked_rank_sees_the_callers_environment_of_this_run(monkeypatch, tmp_path):
    """Runs from one server: each rank sees the variables, TMPDIR and working directory the
    caller had at that run, and leads its own process group."""
    monkeypatch.setenv("LAB_FLAVOUR", "vanilla")
    first = labkit.launch(_where, 2).results
    server = forkserver.server_pid()
    assert server is not None and all(r["ppid"] == server for r in first)
    assert {r["flavour"] for r in first} == {"vanilla"}
    monkeypatch.setenv("LAB_FLAVOUR", "menthe crème")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    second = labkit.launch(_where, 2).results
    assert forkserver.server_pid() == server, "a new server for variables nothing imports"
    for r in second:
        assert (r["flavour"], r["tmp"], r["ppid"]) == ("menthe crème", str(tmp_path), server), r
        assert r["pgid"] == r["pid"], f"rank {r['pid']} does not lead its own process group"
    monkeypatch.chdir(tmp_path)  # the import path starts here now: maybe a new server
    assert {r["cwd"] for r in labkit.launch(_where, 2).results} == {str(tmp_path)}


def test_forked_and_execed_ranks_train_the_same_weights(monkeypatch):
    forked = labkit.run(strategy="ddp", world_size=2, steps=5, progress=False)
    monkeypatch.setenv(forkserver.SWITCH_ENV, "0")
    execed = labkit.run(strategy="ddp", world_size=2, steps=5, progress=False)
    assert forked.params_sha256 == execed.params_sha256
    assert forked.losses == execed.losses


def test_switched_off_ranks_are_the_callers_children(monkeypatch):
    monkeypatch.setenv(forkserver.SWITCH_ENV, "0")
    assert {r["ppid"] for r in labkit.launch(_where, 2).results} == {os.getpid()}


def _kill_the_server(ctx, server):
    import os
    import signal

    if ctx.rank == 0:
        os.kill(server, signal.SIGKILL)
    time.sleep(30)


def test_a_killed_server_fails_the_run_at_once_and_the_next_run_starts_a_new_one(contained):
    labkit.launch(_where, 2)
    server = forkserver.server_pid()
    with pytest.raises(RunFailed) as err:
        labkit.launch(_kill_the_server, 2, server, timeout_s=60)
    # kind "signal", not "timeout": found when the ranks died, not at the timeout
    assert (err.value.kind, "SIGKILL" in err.value.failure.message) == ("signal", True), \
        str(err.value)
    again = labkit.launch(_where, 2).results
    assert forkserver.server_pid() not in (None, server)
    assert {r["ppid"] for r in again} == {forkserver.server_pid()}
    contained.assert_clean()


def _has_module(ctx, name):
    import sys

    return name in sys.modules


def test_preloaded_modules_are_already_imported_in_every_rank(monkeypatch):
    """LABKIT_FORKSERVER_PRELOAD: the server imports them once, every fork has them."""
    assert labkit.launch(_has_module, 2, "wave").results == [False, False]
    monkeypatch.setenv("LABKIT_FORKSERVER_PRELOAD", "wave, colorsys")
    assert labkit.launch(_has_module, 2, "wave").results == [True, True]


def test_a_server_that_cannot_start_falls_back_to_exec_with_one_warning(monkeypatch):
    forkserver.close_all()
    monkeypatch.setenv("LABKIT_FORKSERVER_PRELOAD", "labkit_no_such_module")
    with pytest.warns(UserWarning, match="fork server is off"):
        first = labkit.launch(_where, 2).results
    assert {r["ppid"] for r in first} == {os.getpid()}
    forkserver.close_all()  # forget the failure: later tests get a server again


def test_the_leftover_check_of_the_tests_sees_forked_ranks():
    """``no_leftover_ranks`` (``rank_children``) must count forked ranks, or it could not
    fail: a pool's two ranks are counted while it is open, none after it closed."""
    from tests.conftest import rank_children

    with labkit.Pool(world_size=2) as pool:
        pool.launch(_where)
        assert len(rank_children()) == 2
    assert rank_children() == []
