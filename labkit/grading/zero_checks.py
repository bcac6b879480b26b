"""A sharded Adam step (ZeRO stage 1) over a model of uneven tensors, graded on real ranks.

``zero_adam_step(ctx, params, grads, state, lr, betas, eps)`` (problem set 3, Q3): the
model is a list of tensors whose total size the world size need not divide. As ZeRO does it
(Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", section 5.1: P_os; DeepSpeed's flat, padded partitions), each rank flattens the
gradients into one buffer padded to a multiple of ``world_size``, reduce-scatters it, runs
Adam (Kingma and Ba 2015, Algorithm 1, bias correction included) on its own ``1/n`` shard
only, keeping ``m`` and ``v`` for that shard alone, and all-gathers the updated shards back
into every parameter. Lesson 05 shows the step for momentum SGD (one buffer per shard);
Adam's two moments, its step count and bias correction, and the update in place of a list
of tensors are this exercise's.

Parts: the parameters after three steps equal single-process Adam on the mean gradient
(when they do not, the feedback names the likely slip: no bias correction, the sum instead
of the mean, this rank's gradient alone); the state holds ``m`` and ``v`` of one shard,
``2 x ceil(N/n)`` values; each step is one reduce-scatter of the padded buffer and one
all-gather. Every rank runs in a box of its own; the grader combines and counts each
collective, and computes the reference here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from labkit.grading import calls
from labkit.grading.checks import Verdict
from labkit.grading.parts import Question
from labkit.grading.rank_checks import FORBID, compare, failure, gate, inputs, stub

if TYPE_CHECKING:
    import torch

ZERO_SIZES = (7, 10, 5)  # float64 elements of the visible model's tensors (22: 3 ranks pad to 24)
GRAD_SCALE = 1e-3  # gradients of a realistic size: eps then matters, as in training
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
MATCH = "parameters match Adam on the mean gradient"
STATE = "Adam state sharded: m and v of one shard"
COMM = "one reduce-scatter and one all-gather per step"


def padded_size(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``world_size`` (the flat buffer ZeRO shards)."""
    return world_size * math.ceil(numel / world_size)


def adam_reference(start: torch.Tensor, grads: Sequence[torch.Tensor], lr: float,
                   betas: tuple[float, float], eps: float, bias_correction: bool = True
                   ) -> torch.Tensor:
    """Single-process Adam (Kingma and Ba 2015) on a flat float64 vector, one step per grad."""
    import torch

    p, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    for t, g in enumerate(grads, start=1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = (m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)) if bias_correction \
            else (m, v)
        p = p - lr * m_hat / (v_hat.sqrt() + eps)
    return p


def zero_adam_question(points: float = 3) -> Question:
    return Question("zero_adam_step", points, [MATCH, STATE, COMM])


def add_zero_adam(q: Question, fn: Callable[..., Any], world_size: int = 3,
                  sizes: Sequence[int] = ZERO_SIZES, steps: int = 3, lr: float = LR,
                  betas: tuple[float, float] = BETAS, eps: float = EPS, seed: int = 0) -> None:
    """Same parameters as single-process Adam; Adam's state sharded 1/n; ZeRO's traffic."""
    import torch

    name = "zero_adam_step"
    if stub(q, MATCH, name):
        return
    start = [inputs(seed, 900 + i, 0, n) for i, n in enumerate(sizes)]  # same on every rank
    grads = [[[GRAD_SCALE * inputs(seed, 10 * s + i, r, n) for i, n in enumerate(sizes)]
              for s in range(steps)] for r in range(world_size)]
    try:
        out = calls.launch(fn, "zero_adam", world_size,
                           [[start, grads[r], lr, betas, eps] for r in range(world_size)], FORBID)
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        failure(q, MATCH, name, exc)
        if "equal chunks" in str(exc):
            q.record(MATCH, False, f"{name}: {sum(sizes)} values do not split into "
                     f"{world_size} equal shards. Try: pad the flat buffer with zeros to "
                     f"{padded_size(sum(sizes), world_size)} values (the next multiple of "
                     "world_size) before reduce_scatter, and drop the padding after all_gather.")
        return
    if not gate(q, name, out["results"], out["record"], "your own sharding", allowed=None):
        return
    flat = [torch.cat([g.double() for g in grads[r][s]]) for r in range(world_size)
            for s in range(steps)]
    per_step = [[flat[r * steps + s] for r in range(world_size)] for s in range(steps)]
    begin = torch.cat(start)
    ref = adam_reference(begin, [torch.stack(g).mean(0) for g in per_step], lr, betas, eps)
    slips = {"without bias correction (divide m by 1 - beta1**t and v by 1 - beta2**t, t = "
             "1, 2, ... kept in state)": adam_reference(
                 begin, [torch.stack(g).mean(0) for g in per_step], lr, betas, eps, False),
             "on the sum of the ranks' gradients (divide by world_size: the mean is the "
             "gradient of the global batch)": adam_reference(
                 begin, [torch.stack(g).sum(0) for g in per_step], lr, betas, eps)}
    total, padded = sum(sizes), padded_size(sum(sizes), world_size)
    shard = padded // world_size
    for rank, rec in enumerate(out["results"]):
        where = f"world_size={world_size}, tensors of {list(sizes)} values, rank {rank}"
        slips["on this rank's own gradient only (reduce the gradients across ranks)"] = \
            adam_reference(begin, [g[rank] for g in per_step], lr, betas, eps)
        _record_params(q, name, where, rec["params"], ref, slips, steps)
        own = max(0, min(total, (rank + 1) * shard) - rank * shard)
        values = rec["state_values"]
        q.record(STATE, values in (2 * shard, 2 * shard + 1, 2 * own, 2 * own + 1),
                 f"{name} ({where}): the optimizer state holds {values} values; ZeRO-1 keeps "
                 f"Adam's m and v for this rank's shard only: 2 x {padded} / {world_size} = "
                 f"{2 * shard} values (the step count may be an int). Keep two tensors of the "
                 "shard's size in `state`.")
        for step in range(steps):
            q.record(COMM, _traffic(name, where, out["record"], out["timeline"], rank, step,
                                    padded))


def _record_params(q: Question, name: str, where: str, got: list[dict[str, Any]],
                   ref: torch.Tensor, slips: dict[str, torch.Tensor], steps: int) -> None:
    """The parameters vs Adam; when they miss, name the slip whose result they match."""
    import torch

    if any("error" in g for g in got):
        q.record(MATCH, False, f"{name} ({where}): a parameter " + next(
            str(g["error"]) for g in got if "error" in g) + ". Update `params` in place.")
        return
    values = torch.tensor([x for g in got for x in g["values"]], dtype=torch.float64)
    diff = compare({"values": values.tolist()}, ref)
    if not isinstance(diff, str) and diff <= 1e-9:
        q.record(MATCH, True)
        return
    slip = next((what for what, other in slips.items() if values.numel() == other.numel()
                 and float((values - other).abs().max()) <= 1e-9), None)
    said = diff if isinstance(diff, str) else f"differ from Adam on the mean gradient by " \
        f"up to {diff:.3g}"
    q.record(MATCH, False, f"{name} ({where}): after {steps} steps the parameters {said}" + (
        f"; they match Adam {slip}." if slip else ". Try: flatten the gradients into one "
        "buffer, pad it, reduce-scatter, divide by world_size, run Adam with bias "
        "correction on your shard of the flat parameters, all-gather, and copy the slices "
        "back into params."))


def _traffic(name: str, where: str, record: Any, timeline: Any, rank: int, step: int,
             padded: int) -> Verdict:
    kinds = record.collectives.get((rank, step), [])
    sizes = {e.op.value: e.bytes for e in timeline.select(rank=rank) if e.step == step
             and e.op.value in ("reduce_scatter", "all_gather")}
    ok = kinds == ["reduce_scatter", "all_gather"] and set(sizes.values()) == {8 * padded}
    hint = ("all_reduce sums the whole gradient on every rank, but each rank updates only its "
            "shard: reduce_scatter hands each rank its shard's sum, half the traffic. "
            if "all_reduce" in kinds else "")
    sent = ", ".join(f"{kind} of {size} B" for kind, size in sizes.items()) or "none of them"
    return Verdict(ok, f"{name} ({where}): step {step} ran {kinds or 'no collective'} "
                   f"({sent}); ZeRO-1 runs one reduce_scatter of the padded flat gradient "
                   f"and one all_gather of the padded flat parameters, {padded} float64 = "
                   f"{8 * padded} B each. {hint}One call each for the whole model, not one "
                   "per tensor.")


def check_zero_adam(fn: Callable[..., Any], world_size: int = 3,
                    sizes: Sequence[int] = ZERO_SIZES, steps: int = 3, seed: int = 0) -> Verdict:
    """All ZeRO-Adam parts as one Verdict (tests and scripts)."""
    q = zero_adam_question()
    add_zero_adam(q, fn, world_size, sizes, steps, seed=seed)
    return q.verdict()
