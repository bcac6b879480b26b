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

from labkit.base.events import Op
from labkit.rank.context import RankContext, RankOutput
from labkit.strategies.tp import TPMetrics
from labkit.strategies.tp.cost import tp_bytes_per_layer
from labkit.strategies.tp.layers import TPLayer, build_reference, shard_map
from labkit.train.loop import TrainLoop
from labkit.train.optim import make_optimizer
from labkit.train.parallel.tensor import ComputeClock, TPComm
from labkit.train.training import max_abs_diff


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
            out = torch.empty((src.shape[0] * ctx.tp_comm.world_size, *src.shape[1:]),
                              dtype=src.dtype)
            ctx.tp_comm.all_gather(out, src, name=f"gather.{i}.{local}")
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


class TPLoop(TrainLoop[TPMetrics]):
    """``TrainLoop`` on Megatron-sharded layers: every rank sees the same batch."""

    Record = TPMetrics

    def __init__(self, ctx: RankContext):
        assert ctx.config is not None
        o, n = ctx.config.options, ctx.world_size
        self.clock_tp = ComputeClock(ctx.tracer)
        self.tpc = TPComm(ctx.tp_comm, self.clock_tp)
        if ctx.device.type == "cuda":
            torch.set_default_device(ctx.device)  # weights, shards and buffers on this rank's GPU
        # 1. shard a seeded full model: every rank slices the same weights
        full = build_reference(o.hidden, o.hidden * o.ffn_mult, o.heads, o.layers, o.block,
                               ctx.config.seed)
        model = nn.Sequential(*(TPLayer(layer, ctx.tp_rank, n, self.tpc, i)  # type: ignore[arg-type]
                                for i, layer in enumerate(full))).to(ctx.device)
        super().__init__(ctx, model, full_model=full, clock=False)
        self.first: torch.Tensor | None = None
        self.gathered: dict[str, torch.Tensor] = {}
        self._ref: tuple[torch.Tensor, dict[str, torch.Tensor], list[float]] | None = None

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.cfg.options
        x, y = batch(self.cfg.seed, step, self.cfg.batch_size, o.seq, o.hidden)
        # the input stands for earlier layers' output: f's backward runs
        return x.to(self.ctx.device).requires_grad_(True), y.to(self.ctx.device)

    def begin_step(self, step: int) -> None:
        self.tpc.step = step

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        # 2. forward: compute spans are cut at every all-reduce (g)
        self.clock_tp.begin(Op.FORWARD, step)
        out = self.model(x)
        loss = nn.functional.mse_loss(out, y)
        self.clock_tp.end()
        self.first = out.detach().clone() if self.first is None else self.first
        # 3. backward: f all-reduces the input gradient of every block
        self.clock_tp.begin(Op.BACKWARD, step)
        loss.backward()
        self.clock_tp.end()
        return loss

    def flops_per_step(self, matmul_params: int) -> float:
        from labkit.theory import training_flops

        o = self.cfg.options
        attention = o.layers if o.block in ("both", "attention") else 0
        return training_flops(matmul_params, self.global_batch(), seq=o.seq,
                              attention_layers=attention, hidden=o.hidden)

    def fill_record(self) -> None:
        # 4. measured vs predicted bytes per layer, from this rank's own trace
        o, n, rec = self.cfg.options, self.ctx.world_size, self.record
        per_layer = bytes_by_layer(self.ctx.events(), o.layers)
        predicted = tp_bytes_per_layer(self.cfg.batch_size, o.seq, o.hidden, o.block, 4, n)
        measured = [{"forward": d["forward"][0] if d["forward"] else 0,
                     "backward": d["backward"][0] if d["backward"] else 0} for d in per_layer]
        same_every_step = all(len(set(d["forward"])) <= 1 and len(set(d["backward"])) <= 1
                              for d in per_layer)
        rec.comm_bytes_per_layer_measured = measured
        rec.comm_bytes_per_layer_predicted = {"forward": predicted["forward"],
                                              "backward": predicted["backward"]}
        rec.comm_bytes_match = same_every_step and n > 1 and all(
            m["forward"] == predicted["forward"] and m["backward"] == predicted["backward"]
            for m in measured)
        rec.activation_bytes = self.cfg.batch_size * o.seq * o.hidden * 4
        rec.params_per_rank = sum(p.numel() for p in self.model.parameters())
        rec.params_full = self.stats[0]

    def final_state(self) -> dict[str, torch.Tensor]:
        # 5. the full weights from every rank's shards (a collective)
        self.gathered = gather_full(self.ctx, self.model, self.cfg.options.block)
        o = self.cfg.options
        if o.dtensor_check and o.block in ("both", "mlp"):
            from labkit.strategies.tp.dtensor_check import dtensor_mlp_check

            first_mlp: Any = self.full_model[0].mlp  # type: ignore[index]
            self.record.dtensor = dtensor_mlp_check(self.ctx, first_mlp, self.cfg.seed,
                                                    self.cfg.batch_size, o.seq)
        return self.gathered

    def _reference(self) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[float]]:
        if self._ref is None:
            self._ref = reference_run(self.cfg)
        return self._ref

    def reference_state(self) -> dict[str, torch.Tensor]:
        return self._reference()[1]

    def finish(self) -> RankOutput:
        out = super().finish()
        if self.reports_state():  # always compared: the lesson is that TP changes nothing
            ref_first, ref_state, ref_losses = self._reference()
            assert self.first is not None
            rec = self.record
            rec.max_abs_diff_output = float((self.first - ref_first).abs().max())
            rec.max_abs_diff_loss = max(abs(a - b) for a, b in zip(self.losses, ref_losses))
            rec.max_abs_diff_vs_reference = max_abs_diff(self.gathered, ref_state)
        return out


def train(ctx: RankContext) -> RankOutput:
    assert ctx.config is not None
    if ctx.config.model.kind == "gpt":  # the GPT's own blocks, on the 3D loop with tp only
        from labkit.strategies.hybrid.impl import Axes3D, HybridLoop

        return HybridLoop(ctx, Axes3D()).run()
    return TPLoop(ctx).run()
