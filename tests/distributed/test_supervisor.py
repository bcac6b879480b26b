"""The supervisor's promises, on real gloo ranks: the first failure reaches the caller with
its rank and kind, hung runs end at the timeout with the stuck rank named, concurrent runs
never collide, functions defined at runtime are shipped by value, and no rank survives."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

import labkit
from labkit.base.errors import RunFailed, RunTimeout
from labkit.launchers.supervisor import Supervisor
from tests.conftest import rank_children

pytestmark = [pytest.mark.distributed, pytest.mark.lesson00]


@pytest.mark.parametrize("kind, expected", [("raise", "exception"), ("exit", "exit"),
                                            ("kill", "signal")])
def test_injected_fault_names_the_failing_rank_and_kind(kind, expected, no_leftover_ranks):
    """Found when it happens: the kind is the fault's, never "timeout" (no wall-clock bound:
    a busy machine is slow, not wrong)."""
    with pytest.raises(RunFailed) as err:
        labkit.run(strategy="ddp", world_size=2, steps=6, inject_fault=f"1:3:{kind}",
                   timeout_s=60)
    assert (err.value.rank, err.value.kind) == (1, expected), str(err.value)
    if kind == "raise":
        assert "injected fault: rank raised at step 3" in err.value.failure.traceback
    if kind == "kill":
        assert "SIGKILL" in err.value.failure.message
    _check_partial_timeline(err.value, failed_rank=1, fault_step=3)


def _check_partial_timeline(err: RunFailed, failed_rank: int, fault_step: int) -> None:
    """err.timeline holds every step each rank finished before the failure, and nothing
    the failed rank could not have done."""
    tl = err.timeline
    assert tl is not None and tl.meta["config"]["strategy"] == "ddp"
    finished = {r: sorted(e.step for e in tl.events if e.rank == r and e.op.value == "step"
                          and e.name != "aborted") for r in range(2)}
    assert finished[failed_rank] == list(range(fault_step)), finished
    other = 1 - failed_rank
    assert finished[other][:fault_step] == list(range(fault_step)), finished
    assert not [e for e in tl.events if e.rank == failed_rank and (e.step or 0) >= fault_step]
    assert any(e.op.value == "all_reduce" for e in tl.events)  # comm spans too


def test_hung_rank_is_named_at_the_timeout(no_leftover_ranks):
    with pytest.raises(RunTimeout) as err:
        labkit.run(strategy="ddp", world_size=2, steps=6, inject_fault="0:2:hang", timeout_s=8)
    assert err.value.kind == "timeout" and err.value.rank == 0, str(err.value)
    assert "outside any communication call" in err.value.failure.message
    assert "rank 1 at step 2, in a communication call" in err.value.failure.message
    assert "raise the limit: timeout_s=68" in err.value.failure.message
    assert "rank 1" in err.value.failure.traceback and "inject_fault" in err.value.failure.traceback
    _check_partial_timeline(err.value, failed_rank=0, fault_step=2)


def _steps_forever(ctx):
    import torch

    for step in range(10**9):
        with ctx.step(step):
            ctx.comm.all_reduce(torch.ones(4))
            time.sleep(0.01)


def test_a_run_still_training_at_its_timeout_is_called_slow_not_stuck(no_leftover_ranks):
    """The issue's case: a run training normally when its limit hits is not "no rank made
    progress": the message says each rank's step and how to raise the limit."""
    with pytest.raises(RunTimeout) as err:
        labkit.launch(_steps_forever, 2, timeout_s=6)
    message = err.value.failure.message
    assert err.value.rank is None and "still training, not stuck" in message, message
    assert "rank 0 at step" in message and "rank 1 at step" in message
    assert "raise the limit: timeout_s=66" in message


def test_student_function_defined_here_runs_by_value_on_every_rank(no_leftover_ranks):
    offset = 10  # captured by the closure: must travel by value

    def ring_sum(ctx):
        import torch

        t = torch.full((3,), float(ctx.rank + offset))
        ctx.comm.all_reduce(t)
        return t.tolist()

    res = labkit.launch(ring_sum, 3)
    assert res.results == [[33.0, 33.0, 33.0]] * 3
    ar = [e for e in res.timeline if e.op == labkit.Op.ALL_REDUCE]
    assert sorted(e.rank for e in ar) == [0, 1, 2] and all(e.bytes == 12 for e in ar)


def test_exception_in_a_student_function_carries_its_own_traceback(no_leftover_ranks):
    def broken(ctx):
        if ctx.rank == 2:
            raise ValueError("student bug on purpose")
        import torch

        ctx.comm.all_reduce(torch.ones(1))

    with pytest.raises(RunFailed) as err:
        labkit.launch(broken, 3, timeout_s=30)
    assert err.value.rank == 2 and "student bug on purpose" in err.value.failure.message
    assert "broken" in err.value.failure.traceback


def test_interrupt_reaps_every_rank():
    """The notebook's stop button raises KeyboardInterrupt in the supervisor's loop."""
    import cloudpickle

    from labkit.rank.job import LaunchJob

    def sleepy(ctx):
        time.sleep(60)

    calls = {"n": 0}

    def interrupt(_done):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt

    sup = Supervisor(cloudpickle.dumps(LaunchJob(fn=sleepy)), 2, 60, on_progress=interrupt)
    with pytest.raises(KeyboardInterrupt):
        sup.run()
    assert rank_children() == []
    assert all(p.poll() is not None for p in sup.procs)


def test_concurrent_runs_never_collide(no_leftover_ranks):
    """Many students on one host: file-store rendezvous, no ports to fight over."""
    def one(i):
        return labkit.run(strategy="ddp", world_size=2, steps=2, seed=i, timeout_s=120,
                          threads_per_rank=1).params_sha256

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        hashes = list(pool.map(one, range(6)))
    assert len(set(hashes)) == 6


def test_rank_output_is_captured_per_rank(no_leftover_ranks):
    def talk(ctx):
        print(f"hello from rank {ctx.rank}")

    res = labkit.launch(talk, 2)
    assert "hello from rank 1" in res.logs[1] and "hello from rank 0" in res.logs[0]


def test_launch_rejects_bad_input_before_starting():
    with pytest.raises(labkit.ConfigError, match=r"world_size \(0\) must be >= 1"):
        labkit.launch(lambda ctx: None, 0)
    with pytest.raises(labkit.ConfigError, match="must be callable"):
        labkit.launch(42, 2)


def test_cli_saves_the_timeline_up_to_a_failure(tmp_path, capsys, no_leftover_ranks):
    """`labkit run ... --timeline F` still writes F when a rank dies, and says so."""
    from labkit.analysis.timeline import Timeline
    from labkit.cli import main

    path = tmp_path / "failed.json"
    code = main(["run", "ddp", "--steps", "6", "--inject-fault", "1:3:kill", "--timeline",
                 str(path), "--no-progress", "--timeout", "60"])
    assert code == 1
    assert f"the timeline up to the failure is in {path}" in capsys.readouterr().err
    steps = {e.step for e in Timeline.load(path).events if e.rank == 1}
    assert steps == {0, 1, 2}
