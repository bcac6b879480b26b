"""labkit's GPipe and 1F1B beside PyTorch's: ``torch.distributed.pipelining`` on the same
stages, seed and microbatches.

GPipe (Huang et al. 2019: every forward, then every backward) and 1F1B (Narayanan et al.
2021, PipeDream-Flush: one forward, one backward once the pipe is full) only reorder when
each microbatch's forward and backward run. The arithmetic is the same, so after the same
optimizer steps labkit's executor (``labkit.strategies.pipeline.engine.run_step``, what
``labkit run pipeline`` runs) and PyTorch's ``ScheduleGPipe`` / ``Schedule1F1B`` over a
``PipelineStage`` (https://pytorch.org/docs/stable/distributed.pipelining.html) must hold
the same parameters, up to float rounding. ``compare_with_torch`` checks it on the ranks of
``labkit.launch``, one stage of the lab's GPT per rank:

1. two equal copies of this rank's stage (the seeded GPT cut into equal runs of blocks);
2. ``steps`` SGD steps of labkit's plan on the first copy;
3. the same steps of torch's schedule on the second (torch scales each microbatch's
   gradient by 1/microbatches, as labkit divides each microbatch's loss);
4. the largest difference between the two copies' parameters, and both loss curves.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.config.model import ModelConfig
from labkit.rank.context import RankContext
from labkit.schedules import build_plan
from labkit.schedules.partition import bounds_by_count
from labkit.strategies.pipeline.engine import run_step
from labkit.train.data import TextTask
from labkit.train.data.text import vocab_size_of
from labkit.train.models import build_gpt, layout_of
from labkit.train.parallel.pipeline import Stage

TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}
"""labkit's schedule -> its twin in ``torch.distributed.pipelining``."""


def gpt_stage(ctx: RankContext, model: ModelConfig, seed: int) -> Stage:
    """This rank's stage of the seeded GPT: an equal run of its blocks (the embedding on the
    first stage, the final LayerNorm and head on the last)."""
    full = build_gpt(vocab_size_of(model.vocab_size), model.width, model.depth, model.heads,
                     model.seq_len, seed)
    layout = layout_of(full)
    return Stage(layout, full, ctx.rank, ctx.world_size,
                 bounds_by_count(len(layout.blocks), ctx.world_size))


def _labkit_steps(ctx: RankContext, stage: Stage, task: TextTask, schedule: str,
                  microbatches: int, steps: int, batch_size: int, lr: float) -> list[float]:
    """2. labkit's executor: ``steps`` SGD steps of the plan; the last stage's losses."""
    plan = build_plan(schedule, ctx.world_size, microbatches)
    opt = torch.optim.SGD(stage.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = task.batch(step, batch_size)
        opt.zero_grad(set_to_none=True)
        record = run_step(ctx, plan, {stage.stage: stage}, x, y, step, loss_fn=task.loss)
        opt.step()
        if record.loss is not None:
            losses.append(record.loss)
    return losses


def _torch_steps(ctx: RankContext, stage: Stage, task: TextTask, schedule: str,
                 microbatches: int, steps: int, batch_size: int, lr: float) -> list[float]:
    """3. PyTorch's schedule over a ``PipelineStage`` of the same module; the last stage's
    losses (the mean over microbatches, as labkit reports a step's loss)."""
    from torch.distributed import pipelining

    pipe = pipelining.PipelineStage(stage, ctx.rank, ctx.world_size, ctx.device)
    runner = getattr(pipelining, TORCH_SCHEDULES[schedule])(pipe, microbatches,
                                                            loss_fn=task.loss)
    opt = torch.optim.SGD(stage.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = task.batch(step, batch_size)
        opt.zero_grad(set_to_none=True)
        args = (x,) if stage.first else ()
        mb_losses: list[torch.Tensor] = []
        kwargs: dict[str, Any] = {"target": y, "losses": mb_losses} if stage.last else {}
        runner.step(*args, **kwargs)
        opt.step()
        if stage.last:
            losses.append(float(torch.stack(mb_losses).mean()))
    return losses


def compare_with_torch(ctx: RankContext, schedule: str, microbatches: int, model: ModelConfig,
                       steps: int, batch_size: int, lr: float, seed: int) -> dict[str, Any]:
    """On every rank of ``labkit.launch``: train this rank's stage with labkit's ``schedule``
    and with torch's twin, and compare (steps 1-4 of the module docstring). Returns this
    rank's ``max_abs_diff`` (parameters), its parameter count and, on the last stage, both
    loss curves."""
    if schedule not in TORCH_SCHEDULES:
        raise ValueError(f"schedule {schedule!r} has no twin here; use one of "
                         f"{', '.join(TORCH_SCHEDULES)}, e.g. '1f1b'")
    task = TextTask(seed, model.seq_len, model.vocab_size)
    ours, theirs = gpt_stage(ctx, model, seed), gpt_stage(ctx, model, seed)  # 1.
    labkit_losses = _labkit_steps(ctx, ours, task, schedule, microbatches, steps,  # 2.
                                  batch_size, lr)
    ctx.comm.barrier()  # every labkit message consumed before torch's start
    torch_losses = _torch_steps(ctx, theirs, task, schedule, microbatches, steps,  # 3.
                                batch_size, lr)
    diff = max(float((a - b).abs().max()) for a, b in  # 4.
               zip(ours.parameters(), theirs.parameters(), strict=True))
    return {"rank": ctx.rank, "stage": ours.stage, "max_abs_diff": diff,
            "params": sum(p.numel() for p in ours.parameters()),
            "labkit_losses": labkit_losses, "torch_losses": torch_losses}
