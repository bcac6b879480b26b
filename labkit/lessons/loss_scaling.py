"""fp16 needs loss scaling: a real 2-rank run whose fp16 gradients flush to zero, and the same
run with a dynamic loss scaler (Micikevicius et al. 2018, "Mixed Precision Training").

What is done, exactly (lesson 05 says the same): every rank keeps fp32 master weights and,
each step, copies them into an fp16 model (real fp16 storage and arithmetic, forward and
backward, on the CPU). The loss is the mean squared error over this rank's batch x outputs
in fp32; its gradient enters backward in fp16, so any gradient smaller than fp16's
smallest subnormal (2**-24, about 6e-8) becomes exactly 0 (values between 2**-25 and 2**-24
round up to it). The fp16 gradients are summed over the ranks in fp16 (``ctx.comm.
all_reduce``), then unscaled, averaged and checked in fp32 and applied with Adam to the
masters. The targets are small (outputs of size 1e-5, a quantity in small units or a model
that nearly fits), so with 64 x 64 outputs per rank each output's gradient is about 1e-9:
below fp16's range.

The dynamic scaler multiplies the loss by S before backward (start 2**16, as
``torch.amp.GradScaler``), divides the gradients by S after; when a gradient overflows to
inf/nan it skips the step and halves S, and after ``growth_interval`` good steps it doubles S
(GradScaler waits 2000 steps; a short run uses a short interval). bf16 has fp32's exponent
range, which is why labkit's bf16 runs need no scaler.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.rank.context import RankContext

FP16_TINY = 2.0 ** -24
"""fp16's smallest positive (subnormal) value, about 6e-8."""


def _mlp(d_in: int, d_hidden: int, d_out: int, out_scale: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, d_out))
    with torch.no_grad():
        for p in net[2].parameters():
            p.mul_(out_scale)  # outputs of size ~1e-5
    return net


def fp16_training(ctx: RankContext, scaled: bool, steps: int = 20, batch: int = 64,
                  lr: float = 1e-6, growth_interval: int = 10, out_scale: float = 3e-5,
                  d_in: int = 32, d_hidden: int = 64, d_out: int = 64) -> dict[str, Any]:
    """Train a student MLP towards a teacher's (small) outputs in fp16 on this rank's
    ``batch`` samples per step; ``scaled`` turns the dynamic loss scaler on. Returns per step
    the fp32 loss, the share of gradient entries that are exactly 0 after the all-reduce,
    the scale used and whether the step was skipped."""
    torch.manual_seed(0)  # same teacher and student on every rank
    teacher = _mlp(d_in, d_hidden, d_out, out_scale)
    master = list(_mlp(d_in, d_hidden, d_out, out_scale).parameters())
    half = _mlp(d_in, d_hidden, d_out, 1.0).half()
    opt = torch.optim.Adam(master, lr=lr)
    scale, good = (2.0 ** 16 if scaled else 1.0), 0
    out: dict[str, list[Any]] = {"loss": [], "zero_share": [], "scale": [], "skipped": []}
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(batch * ctx.world_size, d_in, generator=gen)
        x = x[ctx.rank * batch:(ctx.rank + 1) * batch]  # this rank's part of the global batch
        with torch.no_grad():
            y = teacher(x)
            for p, m in zip(half.parameters(), master):
                p.copy_(m)  # 1. fp32 masters -> fp16 working weights
                p.grad = None
        # 2. forward and backward in fp16; the loss (and its scale) in fp32
        loss = nn.functional.mse_loss(half(x.half()).float(), y)
        (loss * scale).backward()
        # 3. sum the fp16 gradients over the ranks, then unscale and average in fp32
        grads = []
        for p in half.parameters():
            assert p.grad is not None
            ctx.comm.all_reduce(p.grad, step=step)
            grads.append(p.grad.float() / (scale * ctx.world_size))
        zeros = sum(int((g == 0).sum()) for g in grads) / sum(g.numel() for g in grads)
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
        out["loss"].append(float(loss.detach()))
        out["zero_share"].append(zeros)
        out["scale"].append(scale)
        out["skipped"].append(not finite)
        # 4. the dynamic scaler: skip and halve on overflow, double after a run of good steps
        if not finite:
            scale, good = scale / 2, 0
            continue
        for m, g in zip(master, grads):
            m.grad = g
        opt.step()
        good += 1
        if scaled and good % growth_interval == 0:
            scale *= 2
    return out


def scaling_text(plain: dict[str, Any], scaled: dict[str, Any]) -> str:
    """What the two runs did, from their numbers: the share of zero gradients and the loss."""
    k = len(plain["loss"])
    p0, p1, s1 = plain["loss"][0], plain["loss"][-1], scaled["loss"][-1]
    zp = sum(plain["zero_share"]) / k
    zs = sum(scaled["zero_share"]) / len(scaled["zero_share"])
    lines = [f"fp16 without scaling: {zp:.0%} of gradient entries were exactly 0 (mean over "
             f"{k} steps); loss {p0:.3g} -> {p1:.3g}",
             f"fp16 with the dynamic scaler: {zs:.0%} zero; loss {scaled['loss'][0]:.3g} -> "
             f"{s1:.3g}; scale {scaled['scale'][0]:g} -> {scaled['scale'][-1]:g}, "
             f"{sum(scaled['skipped'])} step(s) skipped for overflow"]
    if zp > 0.9 and p1 >= 0.9 * p0 and s1 < 0.5 * p1:
        lines.append(f"so: unscaled, the gradients flushed to zero and the model barely moved; "
                     f"scaled, it trained to {p1 / s1:.0f}x lower loss in the same {k} steps")
    elif zp > zs:
        lines.append("so: scaling kept gradients fp16 would have flushed to zero, but on this "
                     "run the loss gap is too small to call it training vs. not")
    else:
        lines.append("so: this run did not underflow more without scaling than with it")
    return "\n".join(lines)
