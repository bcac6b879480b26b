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

from collections import deque
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


STATE_NODES = 10_000  # objects the state walk visits before it gives up (a state is a handful)


def live_storages() -> dict[int, int]:
    """Every tensor storage alive in this process now: address -> values it holds."""
    import gc

    out = {}
    for obj in gc.get_objects():
        kind = type(obj)  # not isinstance: that reads __class__, which a proxy may answer
        if issubclass(kind, torch.Tensor):
            storage = obj.untyped_storage()
            out[storage.data_ptr()] = -(-storage.nbytes() // max(1, obj.element_size()))
        elif issubclass(kind, torch.UntypedStorage):  # a storage kept without its tensor
            out.setdefault(obj.data_ptr(), -(-obj.nbytes() // 8))
    return out


def state_values(state: Any, before: dict[int, int] | None = None) -> int:
    """Values a rank keeps between steps, wherever it hides them; -1 when it cannot tell.

    A rank could keep the full momentum beside a shard-sized decoy: in a nested list, as
    Python floats or bytes, in an object's attributes, as a shard-sized *view* of a
    full-sized tensor, or outside ``state`` altogether (a global, ``ctx``, a closure). So
    every tensor storage alive now that was not alive ``before`` the first step counts in
    full, once (the parameters', gradients' and inputs' were); and the walk of ``state``
    follows every container (dict, list, tuple, set, deque, an object's ``__dict__`` /
    ``__slots__``, a function's closure and defaults, a tensor's attributes) without a
    depth limit, counting its tensors by storage too, a number as one value, bytes as
    8-byte values and a string longer than a name (16 characters) as 8-byte values. A
    state too large to walk counts as -1, which no part accepts.
    """
    storages = {ptr: n for ptr, n in live_storages().items()
                if before is not None and ptr not in before}
    total, seen, stack = 0, set(), [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, (bool, int, float, complex)):  # each time it is held
            total += 1
        elif isinstance(obj, (bytes, bytearray, memoryview)) or isinstance(obj, str) \
                and len(obj) > 16:
            total += -(-len(obj) // 8)
        if id(obj) in seen or obj is None or isinstance(obj, (type, str, bytes, int, float,
                                                              complex)):
            continue
        seen.add(id(obj))
        if len(seen) > STATE_NODES:
            return -1
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = -(-storage.nbytes() // max(1, obj.element_size()))
            stack.extend(getattr(obj, "__dict__", {}).values())
        elif isinstance(obj, (bytearray, memoryview)):
            continue
        elif isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            stack.extend(obj)
        else:
            stack.extend(_attributes(obj))
    return total + sum(storages.values())


def _attributes(obj: Any) -> list[Any]:
    """What an object holds outside a container: attributes, slots, closure, defaults."""
    out: list[Any] = list(getattr(obj, "__dict__", {}).values())
    for cls in type(obj).__mro__:
        slots = getattr(cls, "__slots__", ())
        for slot in [slots] if isinstance(slots, str) else slots:
            if hasattr(obj, slot):
                out.append(getattr(obj, slot))
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    out += list(getattr(obj, "__defaults__", None) or ())
    return out


def zero_adam_rank(ctx: Any, fn: Callable[..., Any], params: list[torch.Tensor],
                   grads: list[list[torch.Tensor]], lr: float, betas: tuple[float, float],
                   eps: float, forbid: Sequence[str]) -> dict[str, Any]:
    """The student's ``zero_adam_step`` once per step (each its own case); the parameters
    afterwards and the size of the state the rank kept."""
    state: dict[str, Any] = {}
    records = []
    before = live_storages()  # the parameters', gradients' and inputs': not the rank's own
    for step, step_grads in enumerate(grads):
        record = _watched(ctx, step, forbid, fn, ctx, params, step_grads, state, lr,
                          tuple(betas), eps)[1]  # what it returned is not kept
        records.append(record)
    return {"params": [summarize(p, p.numel()) for p in params],
            "state_values": state_values(state, before) if isinstance(state, dict) else -1,
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
