"""Rank code of ``labkit run hybrid``: one rank of a dp x pp x tp grid, the parallelisms stacked.

Building this rank's model from the registry's, one transform per axis (phase numbers
match the code; ``labkit.train.parallel``):
  1. every rank builds the same seeded full model on the CPU (``build_model``);
  2. tensor parallelism keeps this rank's slice of each block's split matrices
     (``tensor_parallel``; f/g all-reduce on the ``tp`` comm; with ``sequence_parallel``
     the LayerNorm regions keep 1/t of the sequence and f/g all-gather / reduce-scatter);
     2b. context parallelism keeps this rank's zig-zag tokens and makes every attention
     ring attention on the ``cp`` comm (``context_parallel``); the step's gradients are
     averaged over the cp group before the data-parallel reduction;
     2c. with experts, every MLP is an MoE layer whose experts are split over the ``ep``
     comm (``labkit.strategies.hybrid.experts``; they stay outside ZeRO's units);
  3. pipeline parallelism keeps this rank's stage (``Stage``: its run of blocks, plus the
     prologue on the first stage and the epilogue on the last);
  4. ZeRO on the ``dp`` comm turns every parameter-owning module of the stage into a flat
     unit (``ShardedModel``; stage 0: whole, all-reduced; 1-3: optimizer state, gradients,
     parameters sharded) whose gradients are summed over the microbatches and reduced once
     per step.
Each step then runs the pipeline plan (``labkit.strategies.pipeline.engine.run_step``),
reduces the gradients across the data axis, and steps the optimizer on this rank's shard.
At the end every rank measures its bytes per axis and its model state, and the whole
model's weights are put together on rank 0 (ZeRO all-gather on dp, the slices on tp, the
stages on pp), which hashes them and compares them with one process.

``labkit run tp --model gpt`` and ``labkit run pipeline --model gpt`` run here too, with
the other axes at 1 (the registry routes them: ``Strategy.model_entries``).
"""

from __future__ import annotations

import copy
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from labkit.base.events import Lane
from labkit.base.events import Op as Ev
from labkit.base.grid import GROUP_AXES
from labkit.rank.context import RankOutput, RunContext
from labkit.schedules import build_plan
from labkit.strategies.hybrid.experts import ExpertsOnGrid, build_moe_gpt
from labkit.strategies.hybrid.options import HybridMetrics
from labkit.strategies.pipeline.engine import StepRecord, run_step
from labkit.strategies.zero import accounting as acc
from labkit.trace.comm import wire_bytes
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model, layout_of, task_for
from labkit.train.parallel.context import average_over_cp, context_parallel, shard_targets
from labkit.train.parallel.pipeline import Stage, choose_bounds, gather_stages
from labkit.train.parallel.ring_attention import Ring
from labkit.train.parallel.sequence import sequence_parallel
from labkit.train.parallel.tensor import TPComm, gather_state, tensor_parallel
from labkit.train.parallel.zero import ShardedModel
from labkit.train.training import model_stats


@dataclass(frozen=True)
class Axes3D:
    """How the pipeline and data axes work: a hybrid run's options, or a single-axis
    strategy's (tp, pipeline) when it trains the GPT on this loop."""

    schedule: str = "1f1b"
    microbatches: int = 1
    zero_stage: int = 0
    balance: str = "count"
    sequence_parallel: bool = False
    cp: int = 1

    @classmethod
    def of(cls, options: Any) -> Axes3D:
        """The axes an options dataclass sets (what it does not have keeps its default)."""
        return cls(**{k: getattr(options, k) for k in ("schedule", "microbatches",
                                                        "zero_stage", "balance",
                                                        "sequence_parallel", "cp")
                      if hasattr(options, k)})


class HybridLoop(TrainLoop[HybridMetrics]):
    """One rank of the grid; ``labkit run tp/pipeline --model gpt`` are this loop with the
    other axes at 1."""

    Record = HybridMetrics

    def __init__(self, ctx: RunContext):
        assert ctx.grid is not None
        cfg, grid = ctx.config, ctx.grid
        o = self.axes = Axes3D.of(cfg.options)
        full, task = build_model(cfg), task_for(cfg)                   # 1.
        self.moe = getattr(cfg.options, "experts", 0) > 0
        if self.moe:
            full = build_moe_gpt(full, cfg.options, cfg.seed)
        stats = model_stats(full)
        self.tpc = TPComm(ctx.tp_comm)
        local = full
        if grid.tp > 1:                                                # 2.
            local = tensor_parallel(copy.deepcopy(full), ctx.tp_rank, grid.tp, self.tpc)
            if o.sequence_parallel:  # the LayerNorm regions on 1/t of the sequence
                sequence_parallel(local, self.tpc)
        self.rings: list[Ring] = []
        if grid.cp > 1:                                                # 2b.
            local = local if local is not full else copy.deepcopy(full)
            self.rings = context_parallel(local, ctx.cp_comm)
            self.cp_positions: torch.Tensor = local.cp_positions  # type: ignore[assignment]
        self.experts: ExpertsOnGrid | None = None
        if self.moe:                                                   # 2c.
            local = local if local is not full else copy.deepcopy(full)
            self.experts = ExpertsOnGrid(ctx, local)
        self.plan = build_plan(o.schedule, grid.pp, o.microbatches)
        rows = cfg.batch_size // o.microbatches
        self.bounds = choose_bounds(ctx.comm, layout_of(full), grid.pp, o.balance,
                                    lambda: task.batch(0, rows)[0])  # rank 0 times one microbatch
        stage = Stage(layout_of(local), local, ctx.pp_rank, grid.pp, self.bounds)  # 3.
        self.stage_module = stage.to(ctx.device)
        self.params_held = sum(p.numel() for p in stage.parameters())
        self.full_names = dict(stage.full_names)
        plain = self.experts.local if self.experts is not None else []
        self.sharded = ShardedModel(stage, stage=o.zero_stage, comm=ctx.dp_comm,  # 4.
                                    defer=True, exclude=plain, device=ctx.device)
        extra = self.experts.params if self.experts is not None else []
        super().__init__(ctx, self.sharded, full_model=full,
                         params=[*self.sharded.masters, *extra], clock=False, stats=stats,
                         task=task)
        self.records: list[StepRecord] = []
        self.ln_saved = LayerNormSaved(stage.blocks)

    def begin_step(self, step: int) -> None:
        self.sharded.step = self.tpc.step = step
        for ring in self.rings:
            ring.step = step
        if self.experts is not None:
            self.experts.begin_step(step)
        self.ln_saved.on = step == 0

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float | None:
        record = run_step(self.ctx, self.plan, {self.ctx.pp_rank: self.stage_module}, x, y,
                          step, loss_fn=self.stage_loss)
        self.records.append(record)
        return record.loss

    def stage_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task's loss, against this cp rank's targets under context parallelism."""
        if self.rings:
            y = shard_targets(y, self.cp_positions)
        return self.task.loss(out, y)

    def sync(self, step: int) -> None:
        average_over_cp(self.sharded.trained, self.ctx.cp_comm, step)  # replicas over cp
        if self.experts is not None:
            self.experts.sync(step)
        self.sharded.flush(step)            # one reduction per step across the data axis
        self.sharded.grads_to_masters(step)

    def update(self, step: int) -> None:
        with self.ctx.tracer.span(Ev.OPTIMIZER, step=step):
            self.optimizer.step()
        self.sharded.publish(step)

    # ---- after training ------------------------------------------------------------------
    def fill_record(self) -> None:
        ctx, rec, grid = self.ctx, self.record, self.ctx.grid
        assert grid is not None
        kept = self.sharded.kept()
        kept["optimizer"] = kept["optimizer"] + acc.optimizer_tensors(self.optimizer)
        rec.pp_rank = ctx.pp_rank
        rec.axis_bytes = axis_bytes_per_step(ctx.events(), grid)
        rec.model_state_bytes = acc.storage_bytes(kept)
        rec.params_held = self.params_held
        rec.step_stats = [r.stat for r in self.records]
        steady = self.records[1:] or self.records
        rec.stage_ms = statistics.fmean(sum(r.stage_ns.values()) for r in steady) \
            / self.axes.microbatches / 1e6
        rec.stage_bounds = self.bounds
        rec.grid = grid.as_dict()
        o = self.axes
        rec.zero_stage, rec.schedule, rec.microbatches = o.zero_stage, o.schedule, o.microbatches
        rec.ln_activation_bytes = self.ln_saved.bytes // o.microbatches
        self.ln_saved.close()
        if self.experts is not None:
            e = self.experts
            steps = sorted(e.kept)
            rec.moe_kept_per_step = [e.kept[s] for s in steps]
            rec.moe_calls_per_step = [e.calls[s] for s in steps]
            rec.moe_tokens_per_expert, rec.moe_dropped = e.routed, e.dropped
            rec.moe_aux_loss = e.aux_loss
            e.close()

    def final_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights under its own names, on rank 0 (a collective on every
        axis): each stage's units gathered over dp, its slices over tp, the stages over pp."""
        state = {self.full_names[k]: v for k, v in self.sharded.full_state().items()}
        if self.experts is not None:
            state.update(self.experts.full_state(self.full_names, self.stage_module))
        return gather_stages(gather_state(state, self.ctx.tp_comm), self.ctx.pp_comm)

    def reports_state(self) -> bool:
        return self.ctx.rank == 0

    def reference_state(self) -> dict[str, torch.Tensor]:
        """One process on the global batch; the MoE GPT when the run has experts."""
        if not self.moe:
            return super().reference_state()
        from labkit.train.reference import reference_run

        return reference_run(self.cfg, dp=self.dp, build=lambda c: build_moe_gpt(
            build_model(c), c.options, c.seed)).state


class LayerNormSaved:
    """Bytes autograd keeps for backward inside the blocks' LayerNorms while ``on`` (step 0:
    every microbatch's forward), seen through saved-tensor hooks around each LayerNorm call
    (``labkit.strategies.zero.accounting.SavedActivations``)."""

    def __init__(self, blocks: Any):
        self.on, self.bytes = False, 0
        self._open: acc.SavedActivations | None = None
        lns = [m for m in blocks.modules() if isinstance(m, torch.nn.LayerNorm)]
        self._hooks = [h for ln in lns for h in (ln.register_forward_pre_hook(self._enter),
                                                 ln.register_forward_hook(self._exit))]

    def _enter(self, *_: Any) -> None:
        if self.on and torch.is_grad_enabled():
            self._open = acc.SavedActivations().__enter__()

    def _exit(self, *_: Any) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self.bytes += self._open.bytes
            self._open = None

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def axis_bytes_per_step(events: list[Any], grid: Any) -> dict[str, float]:
    """Wire bytes this rank sent on each axis per step (median over the steady steps)."""
    by_step: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.lane != Lane.COMM or e.step is None or not e.bytes or e.axis is None \
                or e.op in (Ev.RECV, Ev.WAIT):
            continue
        by_step[e.step][e.axis] += wire_bytes(e.op, e.bytes, grid.size(e.axis))
    steps = sorted(by_step)[1:] or sorted(by_step)
    return {axis: statistics.median(by_step[s][axis] for s in steps) if steps else 0.0
            for axis in GROUP_AXES}


def train(ctx: RunContext) -> RankOutput:
    return HybridLoop(ctx).run()
