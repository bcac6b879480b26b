"""What runs INSIDE each rank when a student's code is graded (see ``code_checks``).

Each grader function receives the student's function as cloudpickle bytes and unpickles it
only after ``Spy`` has wrapped ``torch.distributed``'s collectives and point-to-point calls,
so even ``from torch.distributed import all_reduce`` in the student's notebook resolves to
a counting wrapper. Every student call runs inside a STEP span (``step`` = case index): the
parent reads the student's traffic for that case off the returned Timeline. The grader's
own reference communication carries ``name="grader"`` and runs outside those spans.

Results go back as plain Python numbers (the supervisor process never imports torch); the
student's tensors are converted with ``checks.as_tensor`` before any comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from labkit.events import Op
from labkit.grading.checks import as_tensor
from labkit.rank import RankContext

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
               "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "all_gather_object", "broadcast", "all_to_all", "all_to_all_single", "scatter",
               "gather")
SENDS = ("send", "isend")


class Spy:
    """Counts every torch.distributed collective and send while ``active`` (patched in place)."""

    def __init__(self) -> None:
        self.active = False
        self.counts: dict[str, int] = {}
        for name in COLLECTIVES + SENDS + ("batch_isend_irecv",):
            for module in (dist, c10d):
                original = getattr(module, name, None)
                if callable(original) and not getattr(original, "_labkit_spy", False):
                    setattr(module, name, self._wrap(name, original))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.counts[name] = self.counts.get(name, 0) + 1
            return fn(*args, **kwargs)

        counted._labkit_spy = True  # type: ignore[attr-defined]
        return counted

    @contextmanager
    def watch(self) -> Iterator[dict[str, int]]:
        self.counts = {}
        self.active = True
        try:
            yield self.counts
        finally:
            self.active = False


def _load(blob: bytes) -> tuple[Spy, Callable[..., Any]]:
    import cloudpickle

    spy = Spy()
    return spy, cloudpickle.loads(blob)


def _inputs(seed: int, case: int, rank: int, size: int, dtype: torch.dtype = torch.float64
            ) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100_003 + case * 1009 + rank)
    return torch.randn(size, generator=g, dtype=dtype)


def _compare(got: Any, want: torch.Tensor, what: str) -> dict[str, Any]:
    """Plain-data comparison record: error text, or the max abs difference."""
    try:
        t = as_tensor(got, what)
    except TypeError as exc:
        return {"error": str(exc)}
    if tuple(t.shape) != tuple(want.shape):
        return {"error": f"{what} has shape {tuple(t.shape)}, expected {tuple(want.shape)}"}
    return {"max_abs_diff": float((t.double() - want.double()).abs().max().item())
            if t.numel() else 0.0}


def ring_rank(ctx: RankContext, blob: bytes, sizes: list[int], seed: int) -> list[dict[str, Any]]:
    """Run the student's ``ring_all_reduce(ctx, tensor)`` on each size; compare with dist."""
    spy, fn = _load(blob)
    out = []
    for case, size in enumerate(sizes):
        x = _inputs(seed, case, ctx.rank, size)
        work = x.clone()
        with spy.watch() as counts, ctx.tracer.span(Op.STEP, step=case):
            returned = fn(ctx, work)
        result = work if returned is None else returned
        ref = x.clone()
        ctx.comm.all_reduce(ref, name="grader")  # the built-in, outside the student's window
        record = _compare(result, ref, f"ring_all_reduce result (size {size})")
        record.update(size=size, element_bytes=x.element_size(), calls=dict(counts))
        out.append(record)
    return out


def bucket_rank(ctx: RankContext, blob: bytes, sizes: list[int], cap_bytes: int, seed: int
                ) -> dict[str, Any]:
    """Run the student's ``bucketed_allreduce(ctx, grads, cap)``; compare with per-grad avg."""
    spy, fn = _load(blob)
    grads = [_inputs(seed, i, ctx.rank, n, torch.float32) for i, n in enumerate(sizes)]
    work = [g.clone() for g in grads]
    with spy.watch() as counts, ctx.tracer.span(Op.STEP, step=0):
        fn(ctx, work, cap_bytes)
    records = []
    for i, (g, w) in enumerate(zip(grads, work)):
        ref = g.clone()
        ctx.comm.all_reduce(ref, name="grader")
        ref /= ctx.world_size
        rec = _compare(w, ref, f"grads[{i}]")
        rec["index"] = i
        records.append(rec)
    return {"grads": records, "calls": dict(counts)}


def zero1_rank(ctx: RankContext, blob: bytes, size: int, steps: int, lr: float,
               momentum: float, seed: int) -> dict[str, Any]:
    """Run the student's ``zero1_step`` for ``steps`` steps; compare with momentum SGD.

    Every rank can rebuild every rank's gradients from the seed, so the single-process
    reference (mean gradient, one momentum buffer over the whole vector) needs no comm.
    """
    spy, fn = _load(blob)
    n = ctx.world_size
    param = _inputs(seed, 999, 0, size)  # same start on every rank
    ref, buf = param.clone(), torch.zeros(size, dtype=param.dtype)
    state: dict[str, Any] = {}
    calls: dict[str, int] = {}
    for step in range(steps):
        grads = [_inputs(seed, step, r, size) for r in range(n)]
        with spy.watch() as counts, ctx.tracer.span(Op.STEP, step=step):
            fn(ctx, param, grads[ctx.rank].clone(), state, lr, momentum)
        for k, v in counts.items():
            calls[k] = calls.get(k, 0) + v
        # single-process reference: plain momentum SGD on the mean gradient
        buf = momentum * buf + torch.stack(grads).mean(0)
        ref = ref - lr * buf
    state_values = sum(int(v.numel()) for v in state.values() if isinstance(v, torch.Tensor)) \
        if isinstance(state, dict) else -1
    record = _compare(param, ref, "param after the steps")
    record.update(state_values=state_values, shard=size // n, calls=calls)
    return record
