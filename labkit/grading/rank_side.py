"""What runs INSIDE each rank when a student's code is graded (see ``code_checks``).

Each harness receives the student's function as cloudpickle bytes, builds this rank's
inputs from the seed, and calls the function inside a STEP span (``step`` = case index)
with two watchers on (``labkit.grading.sandbox.watch``): ``CallWatch`` for calls into
labkit's own implementations, and a ``TorchDispatchMode`` that counts every ``c10d``
operator, so ``dist.all_reduce``, ``ctx.comm.all_reduce`` and a direct
``_get_default_group().allreduce(...)`` are all seen as the collective they are.

Nothing here compares anything: a harness returns the student's results as plain
numbers, and the grader (``code_checks``), outside the box during autograding, rebuilds
the inputs from the seed and computes the expected values itself. The expected values
never exist in the student's process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.base.events import Op
from labkit.grading.sandbox.watch import CallWatch, make_dispatch_counter
from labkit.rank.context import RankContext

FULL_RESULT_MAX = 5000  # elements; larger results come back as a checksum and a sample
SAMPLE = 64


def inputs(seed: int, case: int, rank: int, size: int, dtype: torch.dtype = torch.float64
           ) -> torch.Tensor:
    """Rank ``rank``'s input for case ``case`` (the grader rebuilds the same tensor)."""
    g = torch.Generator().manual_seed(seed * 100_003 + case * 1009 + rank)
    return torch.randn(size, generator=g, dtype=dtype)


def sample_indices(seed: int, size: int) -> list[int]:
    g = torch.Generator().manual_seed(seed + 7)
    return torch.randint(0, size, (SAMPLE,), generator=g).tolist()


def summarize(value: Any, size: int, seed: int) -> dict[str, Any]:
    """A result as plain data: the numbers, or (for big tensors) sum + sampled values."""
    if not isinstance(value, torch.Tensor):
        return {"error": f"got {type(value).__name__}, not a torch.Tensor"}
    t = value.detach().as_subclass(torch.Tensor).double().reshape(-1)
    if t.numel() != size:
        return {"error": f"has {t.numel()} elements, expected {size}"}
    if size <= FULL_RESULT_MAX:
        return {"values": t.tolist()}
    return {"sum": float(t.sum()), "sample": t[sample_indices(seed, size)].tolist()}


def _load(blob: bytes) -> Callable[..., Any]:
    import cloudpickle

    return cloudpickle.loads(blob)  # type: ignore[no-any-return]


def _watched(ctx: RankContext, step: int, forbid: list[str], fn: Callable[..., Any],
             *args: Any) -> tuple[Any, dict[str, Any]]:
    """Call the student's ``fn`` in a STEP span with both watchers on."""
    counter = make_dispatch_counter()
    with CallWatch(forbid) as watch, counter, ctx.tracer.span(Op.STEP, step=step):
        returned = fn(*args)
    return returned, {"ops": dict(counter.ops), "collectives": counter.collectives(),
                      "sent_bytes": counter.sent_bytes, "used": watch.used,
                      "tampered": watch.tampered}


def ring_rank(ctx: RankContext, blob: bytes, sizes: list[int], seed: int, forbid: list[str]
              ) -> list[dict[str, Any]]:
    """Run the student's ``ring_all_reduce(ctx, tensor)`` once per size."""
    fn = _load(blob)
    out = []
    for case, size in enumerate(sizes):
        work = inputs(seed, case, ctx.rank, size)
        returned, record = _watched(ctx, case, forbid, fn, ctx, work)
        record.update(summarize(work if returned is None else returned, size, seed + case))
        record.update(size=size, element_bytes=8)
        out.append(record)
    return out


def bucket_rank(ctx: RankContext, blob: bytes, sizes: list[int], cap_bytes: int, seed: int,
                forbid: list[str]) -> dict[str, Any]:
    """Run the student's ``bucketed_allreduce(ctx, grads, cap)``; report every gradient."""
    fn = _load(blob)
    work = [inputs(seed, i, ctx.rank, n, torch.float32) for i, n in enumerate(sizes)]
    _, record = _watched(ctx, 0, forbid, fn, ctx, work, cap_bytes)
    record["grads"] = [summarize(w, n, seed + i) for i, (w, n) in enumerate(zip(work, sizes))]
    return record


def zero1_rank(ctx: RankContext, blob: bytes, size: int, steps: int, lr: float,
               momentum: float, seed: int, forbid: list[str]) -> dict[str, Any]:
    """Run the student's ``zero1_step`` for ``steps`` steps; report params and state size."""
    fn = _load(blob)
    param = inputs(seed, 999, 0, size)  # the same start on every rank
    state: dict[str, Any] = {}
    records = []
    for step in range(steps):
        grad = inputs(seed, step, ctx.rank, size)
        _, record = _watched(ctx, step, forbid, fn, ctx, param, grad, state, lr, momentum)
        records.append(record)
    state_values = sum(int(v.numel()) for v in state.values() if isinstance(v, torch.Tensor)) \
        if isinstance(state, dict) else -1
    return {"param": summarize(param, size, seed), "state_values": state_values,
            "collectives": sorted({c for r in records for c in r["collectives"]}),
            "used": sorted({u for r in records for u in r["used"]}),
            "tampered": any(r["tampered"] for r in records)}
