"""Rank code of ``labkit run pipeline``: this rank's stages of the model, one pipeline plan
per step (``labkit.strategies.pipeline.engine``), checked against one process.

The model is cut into contiguous stages (equal block counts, or balanced by the cost rank 0
measures); each rank keeps the stages the plan assigns to it and runs the plan's actions for
them every step. ``run_plan`` (``labkit.lessons.pipeline``) runs a plan a student wrote.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

import torch

from labkit.rank.context import RankContext, RankOutput
from labkit.schedules import Op, Plan
from labkit.strategies.pipeline import PipelineOptions, options_for, plan_for
from labkit.strategies.pipeline.engine import StepRecord, check_only_linears, run_step
from labkit.strategies.pipeline.metrics import PipelineMetrics
from labkit.strategies.pipeline.model import (
    StageModule,
    build_full,
    measure_layer_costs,
    stage_bounds,
)
from labkit.train.loop import TrainLoop

if TYPE_CHECKING:
    from labkit.config.run import ModelConfig



















def build_stages(ctx: RankContext, plan: Plan, model: ModelConfig, opts: PipelineOptions,
                 seed: int, rows: int) -> tuple[dict[int, StageModule], list[int], Any]:
    """This rank's stage modules, the stage boundaries, and the full model (for reference)."""
    full = build_full(model, opts.layer_costs, seed)
    measured = None
    if opts.balance == "cost":  # rank 0 times every layer; all ranks use its numbers
        costs = torch.zeros(model.depth, dtype=torch.float64)
        if ctx.pp_rank == 0:
            costs = torch.tensor(measure_layer_costs(full, rows), dtype=torch.float64)
        ctx.pp_comm.broadcast(costs, 0)
        measured = costs.tolist()
    num = plan.num_model_stages
    bounds = stage_bounds(opts.balance, model.depth, num, measured)
    mods = {s: StageModule(full, s, num, bounds).to(ctx.device)
            for s in range(num) if plan.stage_to_rank(s) == ctx.pp_rank}
    if any(a.op is Op.W for a in plan.actions(ctx.pp_rank)):  # checked once, not every step
        for mod in mods.values():
            check_only_linears(mod)
    return mods, bounds, full


class PipelineLoop(TrainLoop[PipelineMetrics]):
    """``TrainLoop`` whose forward and backward are one step of a pipeline plan."""

    Record = PipelineMetrics

    def __init__(self, ctx: RankContext):
        cfg = ctx.config
        assert cfg is not None
        self.opts = options_for(cfg)
        self.plan = plan_for(self.opts, ctx.grid.pp if ctx.grid is not None else ctx.world_size)
        rows = cfg.batch_size // self.plan.microbatches
        self.mods, self.bounds, full = build_stages(ctx, self.plan, cfg.model, self.opts,
                                                    cfg.seed, rows)
        params = [p for mod in self.mods.values() for p in mod.parameters()]
        super().__init__(ctx, self.mods, full_model=full, params=params, clock=False)
        self.records: list[StepRecord] = []
        self.first_grads: dict[str, torch.Tensor] = {}

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float | None:
        self.records.append(run_step(self.ctx, self.plan, self.mods, x, y, step))
        if step == 0 and self.cfg.check_reference:
            self.first_grads = {n: p.grad.detach().cpu().clone() for mod in self.mods.values()
                                for n, p in zip(mod.param_names(), mod.parameters())
                                if p.grad is not None}
        return self.records[-1].loss

    def final_state(self) -> dict[str, torch.Tensor]:
        return {}  # the weights stay split over the stages; each rank checks its own

    def reports_state(self) -> bool:
        return False

    def fill_record(self) -> None:
        from labkit.strategies.pipeline.reference import reference_check

        plan, rec, records = self.plan, self.record, self.records
        steady = records[1:] or records
        rec.step_stats = [r.stat for r in records]
        rec.stage_ms = [statistics.fmean(r.stage_ns.get(s, 0) for r in steady)
                        / plan.microbatches / 1e6 for s in range(plan.num_model_stages)]
        rec.peak_activations_held = records[-1].peak_activations
        rec.messages_per_step = statistics.fmean(r.messages for r in records)
        rec.bytes_per_step = statistics.fmean(r.bytes_sent for r in records)
        rec.schedule = "custom" if self.opts.orders else self.opts.schedule
        rec.stages, rec.microbatches, rec.virtual = plan.stages, plan.microbatches, plan.virtual
        rec.stage_bounds, rec.balance = self.bounds, self.opts.balance
        if self.cfg.check_reference:
            diffs = reference_check(self.cfg, self.mods, records, self.first_grads)
            rec.max_abs_diff_grads = diffs["max_abs_diff_grads"]
            rec.max_abs_diff_vs_reference = diffs["max_abs_diff_vs_reference"]
            rec.max_abs_diff_loss = diffs["max_abs_diff_loss"]


def train(ctx: RankContext) -> RankOutput:
    """The strategy entry: ``labkit run pipeline`` on every rank."""
    assert ctx.config is not None
    if ctx.config.model.kind == "gpt":  # the GPT's blocks as stages, on the 3D loop
        from labkit.strategies.hybrid.impl import Axes3D, HybridLoop

        o = options_for(ctx.config)
        return HybridLoop(ctx, Axes3D(o.schedule, o.microbatches, 0, o.balance)).run()
    return PipelineLoop(ctx).run()


