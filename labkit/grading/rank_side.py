"""What runs INSIDE each rank when a student's communication code is graded.

Each rank is a box of its own (:mod:`labkit.grading.sandbox.relay_rank`): ``ctx.comm``
carries every message through the grader, which counts it. A harness here receives the
student's function and this rank's own inputs (plain tensors the grader drew; a rank never
learns another rank's inputs, nor the seed they came from), calls the function once per
case inside ``ctx.step(case)`` (so the grader files the traffic under that case), and
returns what the function produced as plain numbers. ``CallWatch`` reports calls into
labkit's own implementations for the student's practice runs; while grading, those
modules are not in the rank's box at all.

Nothing here compares anything: the grader (``code_checks``, ``sync_checks``) computes
the expected values outside, from the inputs it drew.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from labkit.grading.sandbox.watch import CallWatch

FULL_RESULT_MAX = 100_000  # elements a result may have (every exercise's tensors are smaller)


def summarize(value: Any, size: int) -> dict[str, Any]:
    """A result as plain data: its numbers, or what is wrong with it."""
    if not isinstance(value, torch.Tensor):
        return {"error": f"got {type(value).__name__}, not a torch.Tensor"}
    t = value.detach().as_subclass(torch.Tensor).double().reshape(-1)
    if t.numel() != size:
        return {"error": f"has {t.numel()} elements, expected {size}"}
    if size > FULL_RESULT_MAX:
        return {"error": f"has {size} elements, more than the {FULL_RESULT_MAX} a check reads"}
    return {"values": t.tolist()}


def _watched(ctx: Any, case: int, forbid: Sequence[str], fn: Callable[..., Any],
             *args: Any) -> tuple[Any, dict[str, Any]]:
    """Call the student's ``fn`` as case ``case``, watched for calls into ``forbid``."""
    with CallWatch(tuple(forbid)) as watch, ctx.step(case):
        returned = fn(*args)
    return returned, {"used": watch.used, "tampered": watch.tampered}


def ring_rank(ctx: Any, fn: Callable[..., Any], cases: list[torch.Tensor],
              forbid: Sequence[str]) -> list[dict[str, Any]]:
    """The student's ``ring_all_reduce(ctx, tensor)`` on each of this rank's tensors."""
    out = []
    for case, work in enumerate(cases):
        returned, record = _watched(ctx, case, forbid, fn, ctx, work)
        record.update(summarize(work if returned is None else returned, work.numel()))
        out.append(record)
    return out


def bucket_rank(ctx: Any, fn: Callable[..., Any], grads: list[torch.Tensor], cap_bytes: int,
                forbid: Sequence[str]) -> dict[str, Any]:
    """The student's ``bucketed_allreduce(ctx, grads, cap)``; every gradient afterwards."""
    _, record = _watched(ctx, 0, forbid, fn, ctx, grads, cap_bytes)
    record["grads"] = [summarize(g, g.numel()) for g in grads]
    return record


def zero1_rank(ctx: Any, fn: Callable[..., Any], param: torch.Tensor,
               grads: list[torch.Tensor], lr: float, momentum: float,
               forbid: Sequence[str]) -> dict[str, Any]:
    """The student's ``zero1_step`` once per gradient; the parameters and the state size."""
    state: dict[str, Any] = {}
    records = []
    for step, grad in enumerate(grads):
        _, record = _watched(ctx, step, forbid, fn, ctx, param, grad, state, lr, momentum)
        records.append(record)
    state_values = sum(int(v.numel()) for v in state.values() if isinstance(v, torch.Tensor)) \
        if isinstance(state, dict) else -1
    return {"param": summarize(param, param.numel()), "state_values": state_values,
            "used": sorted({u for r in records for u in r["used"]}),
            "tampered": any(r["tampered"] for r in records)}
