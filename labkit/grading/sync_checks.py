"""Gradient sync exercises graded on real ranks: bucketed all-reduce and ZeRO-1.

* ``bucketed_allreduce(ctx, grads, cap_bytes)``: average a list of gradients with one
  all-reduce per bucket (greedy in list order; a bucket closes before it would exceed
  ``cap_bytes``; a gradient larger than the cap travels alone), as PyTorch DDP does.
* ``zero1_step(ctx, param, grad, state, lr, momentum)``: ZeRO stage 1 (Rajbhandari et al.
  2020) for momentum SGD on a flat parameter: each rank keeps optimizer state for its own
  1/n shard only, updates that shard with the mean gradient, and all-gathers the result.

As in ``code_checks``, every rank runs in a box of its own and gets only its own inputs,
drawn here; ``ctx.comm``'s collectives are combined by the grader, which counts each one
(so "one all-reduce per bucket" is the grader's count, not the rank's); only plain
numbers come back and the expected values are computed here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from labkit.base.events import Op
from labkit.grading import calls
from labkit.grading.checks import Verdict
from labkit.grading.parts import Question
from labkit.grading.rank_checks import FORBID, compare, failure, gate, inputs, stub

BUCKET_SIZES = (1000, 10, 300, 5000, 7, 2000, 600)  # float32 elements
BUCKET_CAP = 8000  # bytes


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


def bucket_question(points: float = 3) -> Question:
    return Question("bucketed_allreduce", points, ["averages match", "one all-reduce per bucket"])


def add_buckets(q: Question, fn: Callable[..., Any], world_size: int = 2,
                sizes: Sequence[int] = BUCKET_SIZES, cap_bytes: int = BUCKET_CAP,
                seed: int = 0) -> None:
    """Averages right; one all-reduce per greedy bucket, every byte reduced once."""
    import torch

    name = "bucketed_allreduce"
    if stub(q, "averages match", name):
        return
    grads = [[inputs(seed, i, r, n, torch.float32) for i, n in enumerate(sizes)]
             for r in range(world_size)]
    try:
        out = calls.launch(fn, "bucket", world_size, [[grads[r], cap_bytes]
                                                      for r in range(world_size)], FORBID)
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        failure(q, "averages match", name, exc)
        return
    results, timeline = out["results"], out["timeline"]
    if not gate(q, name, results, out["record"], "your own bucketing, with ctx.comm.all_reduce",
                allowed=("all_reduce",)):
        return
    want = expected_buckets([4 * s for s in sizes], cap_bytes)
    for rank, rec in enumerate(results):
        for i, got in enumerate(rec["grads"]):
            mean = sum(grads[r][i] for r in range(world_size)) / world_size
            diff = compare(got, mean)
            q.record("averages match", not isinstance(diff, str) and diff <= 1e-5,
                     f"{name} (rank {rank}) grads[{i}]: " + (diff if isinstance(diff, str) else
                     f"off the mean over ranks by {diff:.3g}") + ". Try: flatten a bucket "
                     "with torch.cat, all-reduce it, divide by world_size, and copy each "
                     "slice back in place (view_as the original gradient).")
        reduces = [e for e in timeline.select(rank=rank, op=Op.ALL_REDUCE) if e.step == 0]
        ok = len(reduces) == len(want) and sum(e.bytes or 0 for e in reduces) == 4 * sum(sizes)
        q.record("one all-reduce per bucket", ok,
                 f"{name} (rank {rank}): {len(reduces)} all-reduce(s) of "
                 f"{sorted(e.bytes or 0 for e in reduces)} B; with a {cap_bytes} B cap the "
                 f"gradients {list(sizes)} (float32) form {len(want)} buckets {want}. Use "
                 "ctx.comm.all_reduce, fill buckets in list order and close one before it "
                 "would exceed the cap.")


def check_bucketed_sync(fn: Callable[..., Any], world_size: int = 2,
                        sizes: Sequence[int] = BUCKET_SIZES, cap_bytes: int = BUCKET_CAP,
                        seed: int = 0) -> Verdict:
    q = bucket_question()
    add_buckets(q, fn, world_size, sizes, cap_bytes, seed)
    return q.verdict()


# --- ZeRO-1 ---------------------------------------------------------------------------------

def zero1_question(points: float = 3) -> Question:
    return Question("zero1_step", points, ["parameters match momentum SGD",
                                           "optimizer state sharded 1/n"])


def add_zero1(q: Question, fn: Callable[..., Any], world_size: int = 2, size: int = 24,
              steps: int = 3, lr: float = 0.1, momentum: float = 0.9, seed: int = 0) -> None:
    """Same parameters as single-process momentum SGD; optimizer state sharded 1/n."""
    import torch

    name = "zero1_step"
    size = world_size * math.ceil(size / world_size)
    if stub(q, "parameters match momentum SGD", name):
        return
    start = inputs(seed, 999, 0, size)  # the same start on every rank
    grads = [[inputs(seed, step, r, size) for step in range(steps)] for r in range(world_size)]
    try:
        out = calls.launch(fn, "zero1", world_size, [[start, grads[r], lr, momentum]
                                                     for r in range(world_size)], FORBID)
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        failure(q, "parameters match momentum SGD", name, exc)
        return
    if not gate(q, name, out["results"], out["record"], "your own sharding", allowed=None):
        return
    ref, buf = start.clone(), torch.zeros(size, dtype=torch.float64)
    for step in range(steps):  # the single-process reference: momentum SGD on the mean grad
        buf = momentum * buf + torch.stack([grads[r][step] for r in range(world_size)]).mean(0)
        ref = ref - lr * buf
    for rank, rec in enumerate(out["results"]):
        where = f"world_size={world_size}, rank {rank}"
        diff = compare(rec["param"], ref)
        q.record("parameters match momentum SGD", not isinstance(diff, str) and diff <= 1e-9,
                 f"{name} ({where}): after {steps} steps the parameters " +
                 (diff if isinstance(diff, str) else f"differ from plain momentum SGD on the "
                  f"mean gradient by up to {diff:.3g}") + ". Try: average the gradients "
                 "(reduce-scatter, or all-reduce / world_size), update only your shard "
                 "param.chunk(world_size)[rank], then all-gather the shards into param.")
        shard = size // world_size
        q.record("optimizer state sharded 1/n", rec["state_values"] == shard,
                 f"{name} ({where}): the optimizer state holds {rec['state_values']} values; "
                 f"ZeRO-1 keeps only this rank's shard of the momentum, {size} / {world_size} "
                 f"= {shard} values. Store one momentum tensor of the shard's size in `state`.")


def check_zero1(fn: Callable[..., Any], world_size: int = 2, size: int = 24, steps: int = 3,
                lr: float = 0.1, momentum: float = 0.9, seed: int = 0) -> Verdict:
    q = zero1_question()
    add_zero1(q, fn, world_size, size, steps, lr, momentum, seed)
    return q.verdict()
