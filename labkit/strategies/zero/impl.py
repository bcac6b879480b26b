"""``labkit run zero``: our ZeRO stages 0-3 on N ranks, measured against the calculator.

``TrainLoop`` with the hooks ZeRO changes, on the registry's model turned into ZeRO units
(``labkit.train.parallel.zero.ShardedModel``). Each step: (1) forward (stage 3 all-gathers
every layer's parameters just before it and frees them after),
recording the bytes autograd saves; (2) backward: each layer's gradient is all-reduced
(stage 0), kept whole (stage 1) or reduce-scattered into this rank's shard right away
(stages 2-3); (3) ``sync``: stage 1 now reduce-scatters the kept gradients; (4)
``update``: the optimizer updates only the slice this rank owns (fp32 master copy under
bf16), then stages 1-2 all-gather the updated parameters. After the last step each rank
counts the storages it keeps (``accounting``) into its ``ZeroMetrics``; the runner lists
them by rank beside ``labkit.theory.zero_memory`` / ``zero_comm_volume``.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.base.events import Op
from labkit.rank.context import RankContext, RankOutput, RunContext
from labkit.strategies.zero import ZeroMetrics
from labkit.strategies.zero import accounting as acc
from labkit.train.loop import TrainLoop
from labkit.train.models import build_model, layout_of
from labkit.train.parallel.zero import ShardedModel
from labkit.train.training import model_stats


class ZeroLoop(TrainLoop[ZeroMetrics]):
    Record = ZeroMetrics

    def __init__(self, ctx: RunContext):
        opts = ctx.config.options
        self.bf16 = opts.precision == "bf16"
        if ctx.device.type == "cuda":
            torch.set_default_device(ctx.device)  # every flat buffer and shard on this rank's GPU
        full = build_model(ctx.config)
        stats = model_stats(full)
        model = ShardedModel(  # one unit per parameter-owning module; only the shards stay
            full, stage=opts.stage, comm=ctx.dp_comm, pad=opts.pad, device=ctx.device,
            dtype=torch.bfloat16 if self.bf16 else torch.float32,
            layout=layout_of(full) if opts.checkpointing else None,
            checkpoint_segment=opts.checkpoint_segment if opts.checkpointing else 0)
        super().__init__(ctx, model, params=model.masters, clock=False, stats=stats)
        self.kept_params = model.kept()["params"] + self.params
        self.saved: list[int] = []
        self.peaks: list[int] = []

    def begin_step(self, step: int) -> None:
        self.model.step = step
        self.model.meter.reset()

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        # 1. forward (compute spans are recorded per layer inside ShardedLinear)
        with acc.SavedActivations(self.kept_params) as acts, \
                torch.autocast(self.ctx.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.loss(self.model(x), y)
        self.saved.append(acts.bytes)
        # 2. backward: per-layer all-reduce / keep / reduce-scatter
        loss.backward()
        return loss

    def sync(self, step: int) -> None:
        # 3. (stage 1) reduce-scatter the kept gradients; hand each shard to the optimizer
        self.model.grads_to_masters(step)

    def update(self, step: int) -> None:
        # 4. update the owned slice; stages 1-2 all-gather the updated parameters
        with self.ctx.tracer.span(Op.OPTIMIZER, step=step):
            self.optimizer.step()
        self.model.publish(step)
        self.peaks.append(self.model.meter.peak)

    def final_state(self) -> dict[str, torch.Tensor]:
        return self.model.full_state()  # stages 1-3 gather the masters: every rank calls it

    def model_state_bytes(self) -> dict[str, int]:
        """This rank's bytes per term, over the distinct storages it keeps between steps."""
        kept = self.model.kept()
        kept["optimizer"] = kept["optimizer"] + acc.optimizer_tensors(self.optimizer)
        return acc.storage_bytes(kept)

    def fill_record(self) -> None:
        from labkit.theory import mlp_activation_bytes, mlp_step_activation_bytes
        from labkit.train.data.base import Task

        mine = self.model_state_bytes()
        opts, n, layers = self.cfg.options, self.ctx.world_size, self.model.units
        pred = acc.predicted(self.stats[0], n, opts.stage, opts.precision, self.cfg.optimizer)
        elt = 2 if opts.precision == "bf16" else 4
        k = pred["bytes_per_param"]["optimizer"]
        shard_pad = sum(layer.padding() for layer in layers)
        full_pad = sum(layer.padded - layer.numel for layer in layers)
        widths = ([self.cfg.model.in_dim] + [self.cfg.model.width] * self.cfg.model.depth
                  + [self.cfg.model.out_dim])
        rec = self.record
        rec.zero_stage, rec.impl, rec.precision = opts.stage, opts.impl, opts.precision
        rec.checkpointing = opts.checkpointing
        rec.model_state_bytes = mine
        rec.padding = {"params": elt * (shard_pad if opts.stage == 3 else full_pad),
                       "grads": elt * (shard_pad if opts.stage >= 2 else full_pad),
                       "optimizer": k * (shard_pad if opts.stage >= 1 else 0)}
        rec.peak_model_state = sum(mine.values()) + max(self.peaks)
        rec.saved_activations = self.saved[-1]
        rec.padding_elements = full_pad
        if self.cfg.model.kind != "gpt":  # the formula counts an MLP's saved tensors
            # with the loss's, where the task's loss is the classifier's cross-entropy
            whole = type(self.task).loss is Task.loss
            rec.predicted_activation_bytes = (
                mlp_step_activation_bytes if whole else mlp_activation_bytes)(
                self.cfg.batch_size, widths, elt, opts.checkpointing, final_relu=False,
                segment=opts.checkpoint_segment)
        acc.fill_prediction(rec, pred, acc.comm_per_step(self.ctx.events(), n), n)


def zero_on_rank(ctx: RankContext, config: Any) -> dict[str, Any]:
    """labkit's ZeRO (``config.options``) for ``config.steps`` steps on this rank, inside any
    ``labkit.launch``ed function: what a lesson sets a hand-written ZeRO step beside. Returns
    ``weights`` (the whole final fp32 parameters, by name: a collective) and ``bytes`` (this
    rank's model-state bytes per term, counted as ``labkit run zero`` counts them)."""
    loop = ZeroLoop(RunContext.of(ctx, config))
    for step in range(config.steps):
        loop.train_step(step)
    return {"weights": loop.final_state(), "bytes": loop.model_state_bytes()}


def train(ctx: RunContext) -> RankOutput:
    if ctx.config.options.impl == "torch":
        from labkit.strategies.zero.torch_impl import TorchZeroLoop

        return TorchZeroLoop(ctx).run()
    return ZeroLoop(ctx).run()
