"""What runs INSIDE each rank when a student's communication code is graded.

Each rank is a box of its own (:mod:`labkit.grading.sandbox.relay_rank`): ``ctx.comm``
carries every message through the grader, which counts it. A harness here receives the
student's function and this rank's own inputs (plain tensors the grader drew; a rank never
learns another rank's inputs, nor the seed they came from), calls the function once per
case inside ``ctx.step(case)`` (so the grader files the traffic under that case), and
returns what the function produced as plain numbers. ``CallWatch`` reports calls into
labkit's own implementations for the student's practice runs; while grading, those
modules are not in the rank's box at all.

Nothing here compares anything: the grader (``code_checks``, ``sync_checks``,
``zero_checks``) computes
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


def allreduce_rank(ctx: Any, fn: Callable[..., Any], cases: list[torch.Tensor],
                   forbid: Sequence[str]) -> list[dict[str, Any]]:
    """The student's all-reduce ``fn(ctx, tensor)`` on each of this rank's tensors."""
    out = []
    for case, work in enumerate(cases):
        returned, record = _watched(ctx, case, forbid, fn, ctx, work)
        record.update(summarize(work if returned is None else returned, work.numel()))
        out.append(record)
    return out


def accumulate_rank(ctx: Any, fn: Callable[..., Any], micro_grads: list[list[torch.Tensor]],
                    every: int, cap_bytes: int, forbid: Sequence[str]) -> dict[str, Any]:
    """The student's ``accumulate_and_sync`` once per micro-step (each its own case), with
    one ``acc`` list kept between the calls; what each call returned."""
    acc: list[Any] = []
    steps = []
    for step, grads in enumerate(micro_grads):
        returned, record = _watched(ctx, step, forbid, fn, ctx, grads, acc, step, every,
                                    cap_bytes)
        if returned is None:
            record["synced"] = None
        elif isinstance(returned, (list, tuple)) and len(returned) == len(grads):
            record["synced"] = [summarize(g, want.numel()) for g, want in zip(returned, grads)]
        else:
            record["synced"] = {"error": f"returned {type(returned).__name__}"
                                + (f" of {len(returned)}" if isinstance(returned, (list, tuple))
                                   else "") + f", not None or a list of {len(grads)} tensors"}
        steps.append(record)
    return {"steps": steps, "used": sorted({u for r in steps for u in r["used"]}),
            "tampered": any(r["tampered"] for r in steps)}


def state_values(state: Any, depth: int = 0) -> int:
    """Tensor elements in an optimizer state (a dict, list or tuple of tensors, nested)."""
    if isinstance(state, torch.Tensor):
        return int(state.numel())
    if depth > 4:
        return 0
    items = state.values() if isinstance(state, dict) else state \
        if isinstance(state, (list, tuple)) else ()
    return sum(state_values(v, depth + 1) for v in items)


def zero_adam_rank(ctx: Any, fn: Callable[..., Any], params: list[torch.Tensor],
                   grads: list[list[torch.Tensor]], lr: float, betas: tuple[float, float],
                   eps: float, forbid: Sequence[str]) -> dict[str, Any]:
    """The student's ``zero_adam_step`` once per step (each its own case); the parameters
    afterwards and the size of the state the rank kept."""
    state: dict[str, Any] = {}
    records = []
    for step, step_grads in enumerate(grads):
        _, record = _watched(ctx, step, forbid, fn, ctx, params, step_grads, state, lr,
                             tuple(betas), eps)
        records.append(record)
    return {"params": [summarize(p, p.numel()) for p in params],
            "state_values": state_values(state) if isinstance(state, dict) else -1,
            "used": sorted({u for r in records for u in r["used"]}),
            "tampered": any(r["tampered"] for r in records)}


def ring_step_rank(ctx: Any, fn: Callable[..., Any], q: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, forbid: Sequence[str]) -> dict[str, Any]:
    """Problem set 8: this rank's queries attend to its own key/value block (the start of the
    ring, computed here), then the student's ``fn(ctx, q, k, v, out, lse)`` runs ``n - 1`` ring
    steps, each as its own case (its traffic filed under that step)."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    out, lse = torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)
    records = []
    for step in range(ctx.world_size - 1):
        returned, record = _watched(ctx, step, forbid, fn, ctx, q, k, v, out, lse)
        records.append(record)
        if not (isinstance(returned, (tuple, list)) and len(returned) == 4):
            return {"error": "must return (out, lse, k, v): the merged result and the block "
                    "received", "records": records}
        out, lse, k, v = returned
    return {**summarize(out, q.numel()), "records": records}
