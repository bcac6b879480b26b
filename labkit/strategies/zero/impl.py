"""``labkit run zero``: our ZeRO stages 0-3 on N ranks, measured against the calculator.

Each step: (1) forward through ``ShardedMLP`` (stage 3 all-gathers every layer's
parameters just before it and frees them after), recording the bytes autograd saves;
(2) backward: each layer's gradient is all-reduced (stage 0), kept whole (stage 1) or
reduce-scattered into this rank's shard right away (stages 2-3); (3) stage 1 now
reduce-scatters the kept gradients; (4) the optimizer updates only the slice this rank
owns (fp32 master copy under bf16); (5) stages 1-2 all-gather the updated parameters.
After the last step each rank counts the storages it keeps (``accounting``) and rank 0
compares with ``labkit.theory.zero_memory`` / ``zero_comm_volume``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.events import Op
from labkit.rank import RankContext, RankOutput
from labkit.strategies.zero import accounting as acc
from labkit.strategies.zero.sharding import ShardedMLP
from labkit.training import (
    build_mlp,
    make_optimizer,
    max_abs_diff,
    params_sha256,
    reference_train,
    task_for,
)


def train(ctx: RankContext) -> RankOutput:
    cfg = ctx.config
    assert cfg is not None
    opts = cfg.options
    if opts.impl == "torch":
        from labkit.strategies.zero.torch_impl import train_torch

        return train_torch(ctx)
    bf16 = opts.precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    if ctx.device.type == "cuda":
        torch.set_default_device(ctx.device)  # every flat buffer and shard on this rank's GPU
    reference = build_mlp(cfg.model, cfg.seed)
    model = ShardedMLP(reference, stage=opts.stage, dtype=dtype, pad=opts.pad, comm=ctx.comm,
                       checkpointing=opts.checkpointing, segment=opts.checkpoint_segment)
    num_params = sum(p.numel() for p in reference.parameters())
    del reference
    opt = make_optimizer(cfg.optimizer, [layer.master for layer in model.layers], cfg.lr)
    task = task_for(cfg)
    tr, n = ctx.tracer, ctx.world_size
    kept_params = model.kept()["params"] + [layer.master for layer in model.layers]
    losses: list[float] = []
    saved: list[int] = []
    peaks: list[int] = []
    for step in range(cfg.steps):
        with ctx.step(step):
            model.step = step
            model.meter.reset()
            x, y = task.batch(step, cfg.batch_size * n, ctx.rank, n)
            x, y = x.to(ctx.device), y.to(ctx.device)
            # 1. forward (compute spans are recorded per layer inside ShardedLinear)
            with acc.SavedActivations(kept_params) as acts, \
                    torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = nn.functional.cross_entropy(model(x), y)
            saved.append(acts.bytes)
            # 2. backward: per-layer all-reduce / keep / reduce-scatter
            loss.backward()
            # 3. (stage 1) reduce-scatter the kept gradients; hand each shard to the optimizer
            for layer in model.layers:
                layer.master.grad = layer.grad_for_optimizer(step)
            # 4. update the owned slice
            with tr.span(Op.OPTIMIZER, step=step):
                opt.step()
            for layer in model.layers:
                layer.master.grad = None
            # 5. stages 1-2: all-gather the updated parameters
            for layer in model.layers:
                layer.publish(step)
            peaks.append(model.meter.peak)
            losses.append(loss.item())
    kept = model.kept()
    kept["optimizer"] = kept["optimizer"] + acc.optimizer_tensors(opt)
    mine = acc.storage_bytes(kept)
    out = RankOutput(losses=losses)
    out.metrics.update(_metrics(ctx, model, mine, num_params, max(peaks), saved))
    state = model.full_state()
    if ctx.rank == 0:
        out.params_sha256 = params_sha256(state.items())
        if cfg.check_reference:
            out.metrics["max_abs_diff_vs_reference"] = max_abs_diff(
                state, reference_train(cfg, n))
    return out


def _metrics(ctx: RankContext, model: ShardedMLP, mine: dict[str, int], num_params: int,
             peak_transient: int, saved: list[int]) -> dict[str, Any]:
    from labkit.theory import mlp_activation_bytes

    cfg = ctx.config
    assert cfg is not None
    opts, n = cfg.options, ctx.world_size
    pred = acc.predicted(num_params, n, opts.stage, opts.precision, cfg.optimizer)
    elt = 2 if opts.precision == "bf16" else 4
    k = pred["bytes_per_param"]["optimizer"]
    shard_pad = sum(layer.padding() for layer in model.layers)
    full_pad = sum(layer.padded - layer.numel for layer in model.layers)
    padding = {"params": elt * (shard_pad if opts.stage == 3 else full_pad),
               "grads": elt * (shard_pad if opts.stage >= 2 else full_pad),
               "optimizer": k * (shard_pad if opts.stage >= 1 else 0)}
    persistent = sum(mine.values())
    # every rank's numbers, gathered through the traced comm layer (outside any step)
    row = torch.tensor([mine["params"], mine["grads"], mine["optimizer"], padding["params"],
                        padding["grads"], padding["optimizer"], persistent + peak_transient,
                        saved[-1]], dtype=torch.int64)
    table = torch.empty(n * row.numel(), dtype=torch.int64)
    ctx.comm.all_gather(table, row, name="metrics")
    rows = table.view(n, -1).tolist()
    comm = acc.comm_per_step(ctx.events(), n)
    widths = [cfg.model.in_dim] + [cfg.model.width] * cfg.model.depth + [cfg.model.out_dim]
    act_pred = mlp_activation_bytes(cfg.batch_size, widths, elt, opts.checkpointing,
                                    final_relu=False, segment=opts.checkpoint_segment)
    return {
        "zero_stage": opts.stage, "impl": opts.impl, "precision": opts.precision,
        "checkpointing": opts.checkpointing, "num_params": num_params,
        "per_rank_bytes": [dict(zip(acc.TERMS, r[0:3])) for r in rows],
        "predicted_bytes": pred["bytes"],
        "padding_bytes": [dict(zip(acc.TERMS, r[3:6])) for r in rows],
        "padding_elements": full_pad,
        "bytes_per_param": pred["bytes_per_param"],
        "theory_precision": pred["theory_precision"],
        "peak_model_state_bytes": [r[6] for r in rows],
        "saved_activation_bytes": [r[7] for r in rows],
        "predicted_activation_bytes": act_pred,
        "comm_bytes_per_step": comm["wire"],
        "comm_payload_bytes_per_step": comm["payload"],
        "predicted_comm_bytes_per_step": pred["comm_wire"],
        "ddp_comm_bytes_per_step": pred["ddp_comm_wire"],
        "comm_ratio_vs_ddp": comm["wire"] / pred["ddp_comm_wire"] if n > 1 else 0.0,
    }
