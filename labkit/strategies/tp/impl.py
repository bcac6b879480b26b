"""Rank code of ``labkit run tp``: Megatron tensor parallelism checked against the full model.

The model is the GPT's own blocks (``labkit.train.models.gpt.build_blocks``: attention and
MLP, as ``--block`` says) on activations that stand for earlier layers' output; the
tensor-parallel transform (``labkit.train.parallel.tensor.tensor_parallel``) keeps 1/N of
every weight matrix on each rank. Every rank sees the *same* batch (tensor parallelism
splits the model, not the data). Per step:
  1. forward through the split blocks (g all-reduces the partial outputs of each pair),
  2. backward (f all-reduces the input gradient of each pair),
  3. local optimizer step on the slices (no gradient all-reduce: nobody else owns them).
At the end the slices are gathered and compared with one process training the whole model
on the same data (``max_abs_diff_vs_reference``), and the all-reduce bytes of each layer
read off this rank's trace are compared with ``cost.tp_bytes_per_layer``.
``labkit run tp --model gpt`` trains the GPT on the 3D loop (the registry routes it).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import torch

from labkit.base.events import Op
from labkit.rank.context import RankOutput, RunContext
from labkit.strategies.tp.cost import tp_bytes_per_layer
from labkit.strategies.tp.options import TPMetrics
from labkit.train.data import ActivationTask
from labkit.train.loop import TrainLoop
from labkit.train.models import Blocks, build_blocks
from labkit.train.parallel.tensor import ComputeClock, TPComm, gather_state, tensor_parallel
from labkit.train.reference import Reference, max_abs_diff, reference_run


def blocks_for(config: Any) -> Blocks:
    """The whole model of a tp run: ``layers`` blocks of the GPT, shaped by the options."""
    o = config.options
    return build_blocks(o.hidden, o.layers, o.heads, o.seq, o.hidden * o.ffn_mult, o.block,
                        config.seed)


def task_for_blocks(config: Any) -> ActivationTask:
    return ActivationTask(config.seed, config.options.seq, config.options.hidden)


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
    """``TrainLoop`` on Megatron-split blocks: every rank sees the same batch."""

    Record = TPMetrics

    def __init__(self, ctx: RunContext):
        self.clock_tp = ComputeClock(ctx.tracer)
        self.tpc = TPComm(ctx.tp_comm, self.clock_tp)
        if ctx.device.type == "cuda":
            torch.set_default_device(ctx.device)  # weights, slices and buffers on this GPU
        # 1. split a seeded whole model: every rank slices the same weights
        full = blocks_for(ctx.config)
        model = tensor_parallel(copy.deepcopy(full), ctx.tp_rank, ctx.tp_comm.world_size,
                                self.tpc).to(ctx.device)
        super().__init__(ctx, model, full_model=full, clock=False,
                         task=task_for_blocks(ctx.config))
        self.first: torch.Tensor | None = None
        self.gathered: dict[str, torch.Tensor] = {}
        self._ref: Reference | None = None

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().batch(step)
        return x.requires_grad_(True), y  # it stands for earlier layers' output: f's backward runs

    def begin_step(self, step: int) -> None:
        self.tpc.step = step

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        # 2. forward: compute spans are cut at every all-reduce (g)
        self.clock_tp.begin(Op.FORWARD, step)
        out = self.model(x)
        loss = self.loss(out, y)
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
        # 5. the whole weights from every rank's slices (a collective)
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        self.gathered = gather_state(state, self.ctx.tp_comm)
        o = self.cfg.options
        if o.dtensor_check and o.block in ("both", "mlp"):
            from labkit.strategies.tp.dtensor_check import dtensor_mlp_check

            first_mlp: Any = self.full_model[0].mlp  # type: ignore[index]
            self.record.dtensor = dtensor_mlp_check(self.ctx, first_mlp, self.cfg.seed,
                                                    self.cfg.batch_size, o.seq)
        return self.gathered

    def reference(self) -> Reference:
        if self._ref is None:
            self._ref = reference_run(self.cfg, build=blocks_for, task=self.task)
        return self._ref

    def reference_state(self) -> dict[str, torch.Tensor]:
        return self.reference().state

    def finish(self) -> RankOutput:
        out = super().finish()
        if self.reports_state():  # always compared: the lesson is that TP changes nothing
            ref = self.reference()
            assert self.first is not None and ref.first_output is not None
            rec = self.record
            rec.max_abs_diff_output = float((self.first - ref.first_output).abs().max())
            rec.max_abs_diff_loss = max(abs(a - b) for a, b in zip(self.losses, ref.losses))
            rec.max_abs_diff_vs_reference = max_abs_diff(self.gathered, ref.state)
        return out


def train(ctx: RunContext) -> RankOutput:
    return TPLoop(ctx).run()
