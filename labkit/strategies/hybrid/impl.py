"""Rank code of ``labkit run hybrid``: one rank of a dp x pp x tp grid, the parallelisms stacked.

Building this rank's model, outermost axis last (phase numbers match the code):
  1. every rank builds the same seeded full model on the CPU;
  2. tensor parallelism keeps this rank's slice of each block's split matrices
     (``labkit.train.models.gpt.shard_gpt``; f/g all-reduce on the ``tp`` comm);
  3. pipeline parallelism keeps this rank's stage (its run of blocks, plus the embeddings
     on the first stage and the head on the last);
  4. ZeRO on the ``dp`` comm turns every parameter-owning module of the stage into a flat
     unit (stage 0: whole, all-reduced; 1-3: optimizer state, gradients, parameters
     sharded) whose gradients are summed over the microbatches and reduced once per step.
Each step then runs the pipeline plan (``labkit.strategies.pipeline.executor.run_step``),
reduces the gradients across the data axis, and steps the optimizer on this rank's shard.
At the end every rank measures its bytes per axis and its model state, and the ranks that
hold a stage's first tensor-parallel slice on the first data replica gather the stage's full
weights (ZeRO all-gather on dp, then the TP slices on tp) to compare with one process.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, cast

import torch

from labkit.base.events import Lane
from labkit.base.events import Op as Ev
from labkit.rank.context import RankContext, RankOutput
from labkit.schedules import build_plan
from labkit.strategies.hybrid import HybridMetrics
from labkit.strategies.pipeline.engine import StepRecord, run_step
from labkit.strategies.pipeline.partition import bounds_by_cost, bounds_by_count
from labkit.strategies.zero import accounting as acc
from labkit.strategies.zero.modules import ShardedModel
from labkit.trace.comm import wire_bytes
from labkit.train.loop import TrainLoop
from labkit.train.parallel.tensor import TPComm
from labkit.train.training import build_model, model_stats, reference_train


def build_full(config: Any) -> torch.nn.Module:
    """The whole model, identical on every rank: the GPT, or the pipeline lesson's MLP."""
    if config.model.kind == "gpt":
        return build_model(config)
    from labkit.strategies.pipeline.model import build_full as build_pipeline_mlp

    return build_pipeline_mlp(config.model, (), config.seed)


def stage_name(name: str, lo: int) -> str:
    """A stage module's parameter name -> the full model's (blocks / layers renumbered)."""
    head, _, rest = name.partition(".")
    if head in ("blocks", "layers"):
        i, _, tail = rest.partition(".")
        return f"{head}.{lo + int(i)}.{tail}"
    return name


@dataclass(frozen=True)
class Axes3D:
    """How the pipeline and data axes work (a hybrid run's options, or a single-axis
    strategy's settings when it trains the GPT on this loop)."""

    schedule: str = "1f1b"
    microbatches: int = 1
    zero_stage: int = 0
    balance: str = "count"


class HybridLoop(TrainLoop[HybridMetrics]):
    """One rank of the grid; ``labkit run tp/pipeline --model gpt`` are this loop with the
    other axes at 1."""

    Record = HybridMetrics

    def __init__(self, ctx: RankContext, axes: Axes3D | None = None):
        assert ctx.config is not None and ctx.grid is not None
        cfg, grid = ctx.config, ctx.grid
        o = self.axes = axes or Axes3D(cfg.options.schedule, cfg.options.microbatches,
                                       cfg.options.zero_stage, cfg.options.balance)
        self.gpt = cfg.model.kind == "gpt"
        full = build_full(cfg)                                         # 1.
        stats = model_stats(full)
        self.tpc = TPComm(ctx.tp_comm)
        if self.gpt:                                                   # 2.
            from labkit.train.models.gpt import GPTStage, shard_gpt

            local = shard_gpt(cast(Any, full), ctx.tp_rank, grid.tp,
                              self.tpc if grid.tp > 1 else None)
        self.plan = build_plan(o.schedule, grid.pp, o.microbatches)
        self.bounds = self._bounds(ctx, full)
        if self.gpt:                                                   # 3.
            stage: torch.nn.Module = GPTStage(local, ctx.pp_rank, grid.pp, self.bounds)
        else:
            from labkit.strategies.pipeline.model import StageModule

            stage = StageModule(full, ctx.pp_rank, grid.pp, self.bounds)  # type: ignore[arg-type]
        self.stage_module = stage.to(ctx.device)
        self.params_held = sum(p.numel() for p in stage.parameters())
        self.sharded = ShardedModel(stage, stage=o.zero_stage, comm=ctx.dp_comm,  # 4.
                                    defer=True)
        super().__init__(ctx, self.sharded, full_model=full, params=self.sharded.masters,
                         clock=False, stats=stats)
        self.records: list[StepRecord] = []

    def _bounds(self, ctx: RankContext, full: torch.nn.Module) -> list[int]:
        """Blocks per stage: equal counts, or balanced by the cost rank 0 measured."""
        cfg, pp = ctx.config, ctx.grid.pp if ctx.grid is not None else 1
        assert cfg is not None
        if self.axes.balance == "count" or pp == 1:
            return bounds_by_count(cfg.model.depth, pp)
        costs = torch.zeros(cfg.model.depth, dtype=torch.float64)
        if ctx.rank == 0:
            from labkit.strategies.hybrid.costs import measure_block_costs

            rows = cfg.batch_size // self.axes.microbatches
            costs = torch.tensor(measure_block_costs(full, cfg, rows), dtype=torch.float64)
        ctx.comm.broadcast(costs, 0)  # every pipeline replica cuts at the same blocks
        return bounds_by_cost(costs.tolist(), pp)

    def begin_step(self, step: int) -> None:
        self.sharded.step = self.tpc.step = step

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float | None:
        record = run_step(self.ctx, self.plan, {self.ctx.pp_rank: self.stage_module}, x, y,
                          step, loss_fn=self.task.loss)
        self.records.append(record)
        return record.loss

    def sync(self, step: int) -> None:
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
        rec.grid = {"dp": grid.dp, "pp": grid.pp, "tp": grid.tp}
        o = self.axes
        rec.zero_stage, rec.schedule, rec.microbatches = o.zero_stage, o.schedule, o.microbatches

    def final_state(self) -> dict[str, torch.Tensor]:
        """This stage's full weights under the full model's names (collectives on dp, tp)."""
        lo = self.bounds[self.ctx.pp_rank]
        state = {stage_name(k, lo): v for k, v in self.sharded.full_state().items()}
        if self.gpt and self.ctx.grid is not None and self.ctx.grid.tp > 1:
            from labkit.train.models.gpt import split_dim

            tp = self.ctx.tp_comm
            for name, t in state.items():
                dim = split_dim(name)
                if dim is not None:
                    state[name] = gather_slices(tp, t, dim)
        return state

    def reports_state(self) -> bool:
        return self.ctx.dp_rank == 0 and self.ctx.tp_rank == 0

    def reference_state(self) -> dict[str, torch.Tensor]:
        return reference_train(self.cfg, self.dp, build=build_full)

    def finish(self) -> RankOutput:
        out = super().finish()
        if self.ctx.grid is not None and self.ctx.grid.pp > 1:
            out.params_sha256 = None  # each stage holds part of the model, not all of it
        return out


def gather_slices(comm: Any, t: torch.Tensor, dim: int) -> torch.Tensor:
    """The whole tensor from every tensor-parallel rank's slice along ``dim``."""
    src = (t if dim == 0 else t.transpose(0, dim)).contiguous()
    out = torch.empty((src.shape[0] * comm.world_size, *src.shape[1:]), dtype=src.dtype)
    comm.all_gather(out, src, name="gather")
    return out if dim == 0 else out.transpose(0, dim).contiguous()


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
            for axis in ("dp", "pp", "tp")}


def train(ctx: RankContext) -> RankOutput:
    return HybridLoop(ctx).run()
