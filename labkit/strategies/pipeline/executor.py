"""Rank code of ``labkit run pipeline``: this rank's stages of the model, one pipeline plan
per step (``labkit.strategies.pipeline.engine``), checked against one process.

The model is cut into contiguous stages (equal block counts, or balanced by the cost rank 0
measures); each rank keeps the stages the plan assigns to it and runs the plan's actions for
them every step. ``run_plan`` (``labkit.lessons.pipeline``) runs a plan a student wrote.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from labkit.rank.context import RankOutput, RunContext
from labkit.schedules import Op, Plan
from labkit.strategies.pipeline import PipelineOptions, options_for, plan_for
from labkit.strategies.pipeline.engine import StepRecord, check_only_linears, run_step
from labkit.strategies.pipeline.metrics import PipelineMetrics
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model, layout_of, task_for
from labkit.train.parallel.pipeline import Stage, choose_bounds, gather_stages
from labkit.train.reference import Reference, reference_run


def build_stages(ctx: RunContext, plan: Plan, opts: PipelineOptions, full: Any,
                 sample: Any) -> tuple[dict[int, Stage], list[int]]:
    """This rank's stages of ``full`` (the registry's model) and the stage boundaries."""
    layout = layout_of(full)
    num = plan.num_model_stages
    bounds = choose_bounds(ctx.pp_comm, layout, num, opts.balance, sample)
    mods = {s: Stage(layout, full, s, num, bounds).to(ctx.device)
            for s in range(num) if plan.stage_to_rank(s) == ctx.pp_rank}
    if any(a.op is Op.W for a in plan.actions(ctx.pp_rank)):  # checked once, not every step
        for mod in mods.values():
            check_only_linears(mod)
    return mods, bounds


class PipelineLoop(TrainLoop[PipelineMetrics]):
    """``TrainLoop`` whose forward and backward are one step of a pipeline plan."""

    Record = PipelineMetrics

    def __init__(self, ctx: RunContext):
        cfg = ctx.config
        self.opts = options_for(cfg)
        self.plan = plan_for(self.opts, ctx.grid.pp if ctx.grid is not None else ctx.world_size)
        rows = cfg.batch_size // self.plan.microbatches
        full, task = build_model(cfg, self.opts.layer_costs), task_for(cfg)
        self.mods, self.bounds = build_stages(ctx, self.plan, self.opts, full,
                                              lambda: task.batch(0, rows)[0])
        params = [p for mod in self.mods.values() for p in mod.parameters()]
        super().__init__(ctx, self.mods, full_model=full, params=params, clock=False, task=task)
        self.records: list[StepRecord] = []
        self.first_grads: dict[str, torch.Tensor] = {}
        self._ref: Reference | None = None

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float | None:
        self.records.append(run_step(self.ctx, self.plan, self.mods, x, y, step))
        if step == 0 and self.cfg.check_reference:
            self.first_grads = {n: p.grad.detach().cpu().clone() for mod in self.mods.values()
                                for n, p in zip(mod.param_names(), mod.parameters())
                                if p.grad is not None}
        return self.records[-1].loss

    def final_state(self) -> dict[str, torch.Tensor]:
        """The whole model, put together from every stage on the first stage's rank."""
        mine = {n: p.detach() for mod in self.mods.values()
                for n, p in zip(mod.param_names(), mod.parameters())}
        return gather_stages(mine, self.ctx.pp_comm)

    def reports_state(self) -> bool:
        return self.ctx.pp_rank == 0

    def reference(self) -> Reference:
        """One process on the whole batch (trained once per rank that asks)."""
        if self._ref is None:
            costs = self.opts.layer_costs
            self._ref = reference_run(self.cfg, build=lambda c: build_model(c, costs))
        return self._ref

    def reference_state(self) -> dict[str, torch.Tensor]:
        return self.reference().state

    def fill_record(self) -> None:
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
        if self.cfg.check_reference:  # this rank's stages: gradients, weights and losses
            ref = self.reference()
            rec.max_abs_diff_vs_reference = max(
                float((p.detach().cpu() - ref.state[n]).abs().max())
                for mod in self.mods.values() for n, p in zip(mod.param_names(), mod.parameters()))
            rec.max_abs_diff_grads = max(
                (float((g - ref.first_grads[n]).abs().max()) for n, g in self.first_grads.items()),
                default=0.0)
            mine = [r.loss for r in records if r.loss is not None]
            rec.max_abs_diff_loss = max((abs(a - b) for a, b in zip(mine, ref.losses)),
                                        default=0.0)


def train(ctx: RunContext) -> RankOutput:
    """The strategy entry: ``labkit run pipeline`` on every rank (``--model gpt`` runs on the
    3D loop, ``labkit.strategies.hybrid.impl``: the registry routes it)."""
    return PipelineLoop(ctx).run()
