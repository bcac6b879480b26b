"""Gradient accumulation with DDP's ``no_sync``, graded on real ranks (problem set 3, Q2).

``accumulate_and_sync(ctx, grads, acc, micro_step, every, cap_bytes)`` is called once per
micro-step with this rank's fresh gradients. Like PyTorch DDP inside ``no_sync()`` (Li et
al. 2020, "PyTorch Distributed", section 3.2.4: gradient accumulation), it adds them into
``acc`` and sends nothing; on every ``every``-th micro-step it averages the accumulated
gradients over the ranks and the micro-steps of the window, in greedy buckets of at most
``cap_bytes`` with one all-reduce each (the rule lesson 01 shows), returns the averages
and starts the next window. One optimizer step then equals one big batch of
``every x world_size`` micro-batches, for ``1/every`` of the messages.

Parts: the averages (each window's mean over ranks and micro-steps); no collective between
syncs (counted per micro-step by the grader); one all-reduce per bucket at a sync, every
byte reduced once. Gate: ``ctx.comm.all_reduce`` is the only collective.

As in ``code_checks``, every rank runs in a box of its own and gets only its own inputs,
drawn here; ``ctx.comm``'s collectives are combined by the grader, which counts each one;
only plain numbers come back and the expected values are computed here. ZeRO's exercise
lives in ``labkit.grading.zero_checks``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labkit.base.events import Op
from labkit.grading import calls
from labkit.grading.checks import Verdict
from labkit.grading.parts import Question
from labkit.grading.rank_checks import FORBID, compare, failure, gate, inputs, stub

BUCKET_SIZES = (1000, 10, 300, 5000, 7, 2000, 600)  # float32 elements
BUCKET_CAP = 8000  # bytes
EVERY = 2  # micro-steps per optimizer step in the visible test
AVERAGES = "averages over ranks and micro-steps"
QUIET = "no communication between syncs"
BUCKETS = "one all-reduce per bucket at a sync"


def expected_buckets(sizes_bytes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """Greedy buckets in list order (indices); close a bucket before it would exceed the cap."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, b in enumerate(sizes_bytes):
        if current and filled + b > cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += b
    if current:
        buckets.append(current)
    return buckets


def is_sync_step(micro_step: int, every: int) -> bool:
    """Micro-step ``micro_step`` (from 0) ends a window of ``every``: the one that syncs."""
    return (micro_step + 1) % every == 0


def accumulate_question(points: float = 3) -> Question:
    return Question("accumulate_and_sync", points, [AVERAGES, QUIET, BUCKETS])


def add_accumulate(q: Question, fn: Callable[..., Any], world_size: int = 2,
                   sizes: Sequence[int] = BUCKET_SIZES, cap_bytes: int = BUCKET_CAP,
                   every: int = EVERY, windows: int = 2, seed: int = 0) -> None:
    """Run ``windows x every`` micro-steps; check the averages, the quiet micro-steps and
    the buckets at each sync."""
    import torch

    name = "accumulate_and_sync"
    if stub(q, AVERAGES, name):
        return
    steps = every * windows
    grads = [[[inputs(seed, 100 * s + i, r, n, torch.float32) for i, n in enumerate(sizes)]
              for s in range(steps)] for r in range(world_size)]
    try:
        out = calls.launch(fn, "accumulate", world_size,
                           [[grads[r], every, cap_bytes] for r in range(world_size)], FORBID)
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        failure(q, AVERAGES, name, exc)
        return
    results, timeline = out["results"], out["timeline"]
    if not gate(q, name, results, out["record"], "your own accumulation, with "
                "ctx.comm.all_reduce", allowed=("all_reduce",)):
        return
    want = expected_buckets([4 * s for s in sizes], cap_bytes)
    where = f"world_size={world_size}, every={every}"
    for rank, rec in enumerate(results):
        for step, got in enumerate(rec["steps"]):
            reduces = [e for e in timeline.select(rank=rank, op=Op.ALL_REDUCE) if e.step == step]
            if not is_sync_step(step, every):
                q.record(QUIET, not reduces, f"{name} ({where}, rank {rank}): micro-step "
                         f"{step} is not a sync step but ran {len(reduces)} all-reduce(s). "
                         "Inside no_sync DDP only adds the new gradients into acc: "
                         f"all-reduce once per window, when (micro_step + 1) % every == 0.")
                q.record(AVERAGES, got["synced"] is None, f"{name} ({where}, rank {rank}): "
                         f"micro-step {step} returned something; return None until a sync.")
                continue
            _record_sync(q, name, f"{where}, rank {rank}, micro-step {step}", got["synced"],
                         [_window_mean(grads, step, every, i, world_size)
                          for i in range(len(sizes))], reduces, want, sizes, cap_bytes)


def _window_mean(grads: list[list[list[Any]]], step: int, every: int, i: int, n: int) -> Any:
    """Gradient ``i`` averaged over all ranks and the micro-steps of the window ending at ``step``."""
    window = range(step + 1 - every, step + 1)
    return sum(grads[r][s][i].double() for r in range(n) for s in window) / (n * every)


def _record_sync(q: Question, name: str, where: str, synced: Any, means: list[Any],
                 reduces: list[Any], want: list[list[int]], sizes: Sequence[int],
                 cap_bytes: int) -> None:
    if not isinstance(synced, list):
        q.record(AVERAGES, False, f"{name} ({where}): " + (
            "returned None at a sync step; return the list of averaged gradients."
            if synced is None else str(synced.get("error", synced))))
    else:
        for i, (got, mean) in enumerate(zip(synced, means)):
            diff = compare(got, mean)
            q.record(AVERAGES, not isinstance(diff, str) and diff <= 1e-5,
                     f"{name} ({where}) gradient {i}: " + (diff if isinstance(diff, str) else
                     f"off the mean over ranks and micro-steps by {diff:.3g}") + ". Try: add "
                     "each micro-step's gradients into acc; at a sync divide by every AND by "
                     "world_size (one big batch's mean), then empty acc for the next window.")
    ok = len(reduces) == len(want) and sum(e.bytes or 0 for e in reduces) == 4 * sum(sizes)
    q.record(BUCKETS, ok, f"{name} ({where}): {len(reduces)} all-reduce(s) of "
             f"{sorted(e.bytes or 0 for e in reduces)} B; with a {cap_bytes} B cap the "
             f"gradients {list(sizes)} (float32) form {len(want)} buckets {want}. Fill buckets "
             "in list order, close one before it would exceed the cap, and all-reduce each "
             "flattened bucket once (float32).")


def check_accumulate(fn: Callable[..., Any], world_size: int = 2,
                     sizes: Sequence[int] = BUCKET_SIZES, cap_bytes: int = BUCKET_CAP,
                     every: int = EVERY, seed: int = 0) -> Verdict:
    """All accumulation parts as one Verdict (tests and scripts)."""
    q = accumulate_question()
    add_accumulate(q, fn, world_size, sizes, cap_bytes, every, seed=seed)
    return q.verdict()


__all__ = ["BUCKET_CAP", "BUCKET_SIZES", "EVERY", "accumulate_question", "add_accumulate",
           "check_accumulate", "expected_buckets", "is_sync_step"]
