"""The timeout's verdict (``labkit.launchers.verdict.hang``) without processes: a run still
finishing steps is slow, not stuck; a stuck rank is named; every message says what each
rank was doing at which step and how to raise the limit (issue 25, item 6)."""

from __future__ import annotations

from labkit.launchers.verdict import hang, still_training, waits_in_torch


def test_a_run_still_finishing_steps_is_reported_slow_not_stuck() -> None:
    """The issue's run: training normally at step 8259 when its 120 s limit hit."""
    err = hang(120, [0, 1], {0: False, 1: True}, {0: 8259, 1: 8259}, {0: "", 1: ""},
               idle_s={0: 0.1, 1: 0.05}, busy_s={0: 119.9, 1: 119.95})
    message = err.failure.message
    assert err.rank is None and "no rank made progress" not in message
    assert "still training, not stuck" in message
    assert "rank 0 at step 8259, computing" in message
    assert "rank 1 at step 8259, in a communication call" in message
    assert "raise the limit: timeout_s=240" in message and "--timeout 240" in message


def test_a_rank_stuck_outside_communication_is_named_with_what_the_others_did() -> None:
    err = hang(8, [0, 1], {0: False, 1: True}, {0: 2, 1: 2}, {0: "stack 0", 1: "stack 1"},
               idle_s={0: 7.5, 1: 7.4}, busy_s={0: 0.5, 1: 0.6})
    message = err.failure.message
    assert err.rank == 0 and "rank 0 stopped making progress at step 2" in message
    assert "rank 1 at step 2, in a communication call, its last step 7.4 s ago" in message
    assert "if it is only slow, raise the limit: timeout_s=68" in message
    assert "stack 1" in err.failure.traceback


def test_without_step_times_the_verdict_still_says_what_each_rank_did() -> None:
    """The emulated cluster's board has steps and flags but no history."""
    err = hang(30, [0, 1], {0: True, 1: True}, {0: 5, 1: 5}, {0: "", 1: ""})
    assert "no rank finished a step lately (rank 0 at step 5, in a communication call; " \
        "rank 1 at step 5" in err.failure.message


def test_a_rank_silent_for_far_longer_than_its_own_steps_is_not_still_training() -> None:
    # 10 steps in 1 s (0.1 s each), then nothing for 5 s
    assert not still_training({0: 10}, {0: 5.0}, {0: 1.0})
    assert still_training({0: 10}, {0: 0.2}, {0: 1.0})
    assert not still_training({0: 0}, {0: 0.2}, {0: 1.0})  # never finished a step


# faulthandler's format, as a rank writes it on SIGUSR1 (most recent call first)
_IN_DDP_REBUILD = """Thread 0x00007f12 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 622 in wait

Current thread 0x00007f34 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1775 in _pre_forward
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1870 in forward
  File "/work/labkit/train/loop.py", line 140 in forward_backward
"""
_COMPUTING_IN_DDP = """Current thread 0x00007f34 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125 in forward
  File "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", line 1650 in _run_ddp_forward
  File "/work/labkit/train/loop.py", line 140 in forward_backward
"""


def test_a_stack_waiting_in_a_collective_torch_issued_counts_as_communication() -> None:
    """Issue 36, item 3: at step 1 DDP rebuilds its buckets with a broadcast of its own,
    outside labkit's traced Comm, so the board flag of the rank waiting there is 0; its
    stack says where it waits. A rank computing inside DDP's forward is not waiting."""
    assert waits_in_torch(_IN_DDP_REBUILD)
    assert not waits_in_torch(_COMPUTING_IN_DDP)
    assert not waits_in_torch("")
    hung = '  File "/work/labkit/rank/context.py", line 90 in inject_fault\n'
    err = hang(10, [0, 1], {0: False, 1: False}, {0: 1, 1: 1},
               {0: _IN_DDP_REBUILD, 1: "Current thread 0x1 (most recent call first):\n" + hung})
    assert err.rank == 1, err.failure.message
    assert "rank 1 stopped making progress at step 1 outside any communication call, while " \
        "rank(s) 0 waited for it" in err.failure.message


def test_steps_are_counted_from_the_first_step_a_rank_began() -> None:
    """A run resumed at step 40 that finished 2 steps of 3 s and is 2 s into its third is
    still training: counted as 42 steps in 6 s, its 2 s looked like a hang."""
    args = (20, [0, 1], {0: False, 1: True}, {0: 42, 1: 42}, {0: "", 1: ""})
    times = {"idle_s": {0: 2.0, 1: 2.0}, "busy_s": {0: 6.0, 1: 6.0}}
    assert "still training" in hang(*args, **times, done={0: 2, 1: 2}).failure.message
    assert hang(*args, **times).rank == 0  # counted from step 0: "stuck"
