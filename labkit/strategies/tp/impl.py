"""Rank code of ``labkit run tp``: Megatron tensor parallelism checked against the full model.

Every rank holds 1/N of every weight matrix and sees the *same* batch (tensor parallelism
splits the model, not the data). Per step:
  1. forward through the sharded layers (g all-reduces the partial outputs of each block),
  2. backward (f all-reduces the input gradient of each block),
  3. local optimizer step on the shards (no gradient all-reduce: nobody else owns them).
At the end the shards are gathered and compared with a single-process run of the unsharded
model on the same data (``max_abs_diff_vs_reference``), and the all-reduce bytes of each
layer read off this rank's trace are compared with ``cost.tp_bytes_per_layer``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn

from labkit.events import Op
from labkit.rank import RankContext, RankOutput
from labkit.strategies.tp.cost import tp_bytes_per_layer
from labkit.strategies.tp.layers import TPLayer, build_reference, shard_map
from labkit.strategies.tp.ops import ComputeClock, TPComm
from labkit.training import make_optimizer, params_sha256


def batch(seed: int, step: int, b: int, s: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s input (standing for the output of earlier layers) and its target."""
    g = torch.Generator().manual_seed(seed * 100003 + step)
    cpu = torch.device("cpu")
    return (torch.randn(b, s, h, generator=g, device=cpu),
            torch.randn(b, s, h, generator=g, device=cpu))


def reference_run(cfg: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[float]]:
    """One process, unsharded: (output of step 0, final state dict, losses)."""
    o = cfg.options
    model = build_reference(o.hidden, o.hidden * o.ffn_mult, o.heads, o.layers, o.block, cfg.seed)
    opt = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    first, losses = None, []
    for step in range(cfg.steps):
        x, y = batch(cfg.seed, step, cfg.batch_size, o.seq, o.hidden)
        out = model(x)
        first = out.detach().clone() if first is None else first
        loss = nn.functional.mse_loss(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert first is not None
    return first, {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def gather_full(ctx: RankContext, model: nn.Sequential, block: str) -> dict[str, torch.Tensor]:
    """Reassemble the full weights from every rank's shards (traced all-gathers)."""
    full: dict[str, torch.Tensor] = {}
    mapping = shard_map(block)
    for i, layer in enumerate(model):
        for local, (ref_name, dim) in mapping.items():
            p = layer.get_parameter(local).detach()
            if dim is None:
                full[f"{i}.{ref_name}"] = p.clone()
                continue
            src = p if dim == 0 else p.T
            src = src.contiguous()
            out = torch.empty((src.shape[0] * ctx.world_size, *src.shape[1:]), dtype=src.dtype)
            ctx.comm.all_gather(out, src, name=f"gather.{i}.{local}")
            full[f"{i}.{ref_name}"] = out if dim == 0 else out.T.contiguous()
    return full


def bytes_by_layer(events: list[Any], layers: int) -> list[dict[str, list[int]]]:
    """Per layer: the forward (g) and backward (f) all-reduce payload bytes of every step."""
    per: list[dict[str, dict[int, int]]] = [
        {"forward": defaultdict(int), "backward": defaultdict(int)} for _ in range(layers)]
    for e in events:
        if e.op != Op.ALL_REDUCE or not e.name or not e.name.startswith("L"):
            continue
        layer = int(e.name[1:].split(".")[0])
        phase = "forward" if e.name.endswith(".g") else "backward"
        per[layer][phase][e.step] += e.bytes or 0
    return [{k: [v[s] for s in sorted(v)] for k, v in d.items()} for d in per]


def train(ctx: RankContext) -> RankOutput:
    cfg = ctx.config
    assert cfg is not None
    o = cfg.options
    n = ctx.world_size
    clock = ComputeClock(ctx.tracer)
    tpc = TPComm(ctx.comm, clock)
    if ctx.device.type == "cuda":
        torch.set_default_device(ctx.device)  # weights, shards and buffers on this rank's GPU
    # 1. shard a seeded full model: every rank slices the same weights
    full = build_reference(o.hidden, o.hidden * o.ffn_mult, o.heads, o.layers, o.block, cfg.seed)
    model = nn.Sequential(*(TPLayer(layer, ctx.rank, n, tpc, i)  # type: ignore[arg-type]
                           for i, layer in enumerate(full))).to(ctx.device)
    opt = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    losses, first = [], None
    for step in range(cfg.steps):
        with ctx.step(step):
            tpc.step = step
            x, y = batch(cfg.seed, step, cfg.batch_size, o.seq, o.hidden)
            x, y = x.to(ctx.device), y.to(ctx.device)
            x.requires_grad_(True)  # the input stands for earlier layers' output: f's backward runs
            # 2. forward: compute spans are cut at every all-reduce (g)
            clock.begin(Op.FORWARD, step)
            out = model(x)
            loss = nn.functional.mse_loss(out, y)
            clock.end()
            first = out.detach().clone() if first is None else first
            # 3. backward: f all-reduces the input gradient of every block
            opt.zero_grad(set_to_none=True)
            clock.begin(Op.BACKWARD, step)
            loss.backward()
            clock.end()
            with ctx.tracer.span(Op.OPTIMIZER, step=step):
                opt.step()
            losses.append(loss.item())
    # 4. measured vs predicted bytes per layer, from this rank's own trace
    per_layer = bytes_by_layer(ctx.events(), o.layers)
    predicted = tp_bytes_per_layer(cfg.batch_size, o.seq, o.hidden, o.block, 4, n)
    measured = [{"forward": d["forward"][0] if d["forward"] else 0,
                 "backward": d["backward"][0] if d["backward"] else 0} for d in per_layer]
    same_every_step = all(len(set(d["forward"])) <= 1 and len(set(d["backward"])) <= 1
                          for d in per_layer)
    metrics: dict[str, Any] = {
        "comm_bytes_per_layer_measured": measured,
        "comm_bytes_per_layer_predicted": {"forward": predicted["forward"],
                                           "backward": predicted["backward"]},
        "comm_bytes_match": same_every_step and n > 1 and all(
            m["forward"] == predicted["forward"] and m["backward"] == predicted["backward"]
            for m in measured),
        "activation_bytes": cfg.batch_size * o.seq * o.hidden * 4,
        "params_per_rank": sum(p.numel() for p in model.parameters()),
        "params_full": sum(p.numel() for p in full.parameters()),
    }
    # 5. compare with the unsharded model trained on one process
    gathered = gather_full(ctx, model, o.block)
    if o.dtensor_check and o.block in ("both", "mlp"):
        from labkit.strategies.tp.dtensor_check import dtensor_mlp_check

        first_mlp: Any = full[0].mlp
        metrics["dtensor"] = dtensor_mlp_check(ctx, first_mlp, cfg.seed, cfg.batch_size, o.seq)
    out_ = RankOutput(losses=losses, metrics=metrics)
    if ctx.rank == 0:
        ref_first, ref_state, ref_losses = reference_run(cfg)
        assert first is not None
        metrics["max_abs_diff_output"] = float((first - ref_first).abs().max())
        metrics["max_abs_diff_vs_reference"] = max(
            float((gathered[k] - ref_state[k]).abs().max()) for k in ref_state)
        metrics["max_abs_diff_loss"] = max(abs(a - b) for a, b in zip(losses, ref_losses))
        out_.params_sha256 = params_sha256(gathered.items())
    return out_
