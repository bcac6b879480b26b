"""The lab's own runs as the planner sees them: the lesson GPT and its layouts on this machine.

Teaches the last step of issue 38's bridge (item 4): the layouts a student runs with ``labkit
run`` (hybrid dp x pp x tp on 8 and 4 ranks; 2-rank DDP, ZeRO-1 and a 1F1B pipeline) are
planner layouts like Llama 3's, and "this machine" (``plan_local``: a fitted step cost,
shared cores, the fitted wire) is a cluster like 16,384 H100s. ``rank_lab`` predicts each
and ranks them by step time; ``bench/bench_plan_local.py`` runs them and prints predicted /
measured. Pure: ``labkit.lessons.plan_local`` turns a ``LabLayout`` into ``labkit.run``'s
arguments and measures the step cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError
from labkit.theory.plan import Prediction
from labkit.theory.plan_local import StepCost
from labkit.theory.plan_machine import Calls, RankCalls, predict_here
from labkit.theory.plan_models import Decoder, Training
from labkit.theory.plan_terms import Layout

LAB_GPT = Decoder("lesson-gpt", 4, 64, 4, 4, 256, False, 96, 32, bias=True,
                  learned_positions=True)
"""The lessons' GPT (``labkit.lessons.parallel3d.LESSON_GPT``: width 64, depth 4, 4 heads,
32-token sequences, the 96-character vocabulary), as ``lesson_decoder`` counts it."""
LAB_BATCH = 8
"""Sequences per data-parallel rank per step (labkit's ``batch_size``)."""


@dataclass(frozen=True, kw_only=True)
class LabLayout:
    """One of the lab's runs, as ``labkit.run`` takes it and as the planner sees it."""

    name: str
    """How the bench and ``labkit plan --gpu this-machine`` print it."""
    strategy: str
    """``labkit run`` strategy: hybrid, ddp, zero or pipeline."""
    dp: int = 1
    """Data-parallel ranks."""
    pp: int = 1
    """Pipeline stages."""
    tp: int = 1
    """Tensor-parallel ranks."""
    zero: int = 0
    """ZeRO stage (the zero strategy)."""

    @property
    def ranks(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def microbatches(self) -> int:
        """Two microbatches through a pipeline (the lessons' default), else one."""
        return 2 if self.pp > 1 else 1

    def layout(self) -> Layout:
        return Layout(self.dp, self.tp, self.pp, LAB_BATCH // self.microbatches,
                      self.microbatches, zero=self.zero)

    def training(self) -> Training:
        """What the lab trains with: fp32, momentum SGD, ``LAB_BATCH`` sequences per dp rank."""
        return Training(global_batch_tokens=LAB_BATCH * self.dp * LAB_GPT.seq,
                        precision="fp32", optimizer="momentum", recompute="none")


LAYOUTS = (LabLayout(name="hybrid dp2 x pp2 x tp2", strategy="hybrid", dp=2, pp=2, tp=2),
           LabLayout(name="hybrid pp2 x tp2", strategy="hybrid", pp=2, tp=2),
           LabLayout(name="hybrid dp2 x tp2", strategy="hybrid", dp=2, tp=2),
           LabLayout(name="hybrid dp2 x pp2", strategy="hybrid", dp=2, pp=2),
           LabLayout(name="ddp 2", strategy="ddp", dp=2),
           LabLayout(name="zero-1 2", strategy="zero", dp=2, zero=1),
           LabLayout(name="pipeline 2 (1F1B)", strategy="pipeline", pp=2))


UNITS_PER_LAYER = 10
"""ZeRO units of a block of the lab's GPT (``labkit.train.parallel.zero``: one per module
that owns parameters): ln1, q, k, v, o, o_bias, ln2, fc, proj, proj_bias
(``labkit.train.models.gpt``)."""
END_UNITS = 2
"""Units outside the blocks at each end: tok and pos (first stage), ln_f and head (last)."""


def lab_calls(lay: LabLayout) -> list[RankCalls]:
    """The collectives each rank of ``lay`` issues in a step, as labkit's engines issue them:

    * tp: Megatron's f and g, 4 all-reduces per layer per microbatch of ``b s h`` fp32
      (``labkit.train.parallel.tensor``; embeddings and head stay whole);
    * pp: a rank of a 2-stage pipeline sends m activations and receives m gradients (or
      the reverse): m exchanges of ``b s h`` fp32 (``labkit.strategies.pipeline.engine``);
    * dp: DDP one bucket all-reduce of all gradients (torch DDP's first bucket holds the
      lesson GPT's 0.9 MB); the ZeRO transform (hybrid's stage 0, ``zero``) one all-reduce
      per unit (stage 0), or a reduce-scatter and an all-gather per unit (stage 1), of the
      unit's parameters (``labkit.train.parallel.zero``), each priced as measured.
    """
    m, b = lay.microbatches, LAB_BATCH // lay.microbatches
    act = b * LAB_GPT.seq * LAB_GPT.hidden * 4
    kinds = []
    stages = [(0, lay.pp)] if lay.pp == 1 else [(0, lay.pp), (lay.pp - 1, lay.pp)]
    for stage, p in stages:
        layers = LAB_GPT.layers // p
        ends = (stage == 0) + (stage == p - 1)
        params = (layers * LAB_GPT.layer_params / lay.tp + (stage == 0) * LAB_GPT.embedding_params
                  + (stage == p - 1) * LAB_GPT.head_params)
        calls = []
        if lay.tp > 1:
            n = 4 * layers * m
            calls.append(Calls(group="tp", op="all_reduce", calls=n, nbytes=n * act,
                               how=f"4 x {layers} layers x m={m} (f, g)"))
        if lay.pp > 1:
            calls.append(Calls(group="pp", op="exchange", calls=m, nbytes=m * act / lay.tp,
                               how=f"m={m} activations out, gradients back"))
        if lay.dp > 1 and lay.strategy == "ddp":
            calls.append(Calls(group="dp", op="all_reduce", calls=1, nbytes=4 * params,
                               how="DDP's one bucket"))
        elif lay.dp > 1:
            units = UNITS_PER_LAYER * layers + END_UNITS * ends
            for op in ("reduce_scatter", "all_gather") if lay.zero else ("all_reduce",):
                calls.append(Calls(group="dp", op=op, calls=units, nbytes=4 * params,
                                   how=f"{units} ZeRO units"))
        kinds.append(RankCalls(ranks=lay.ranks // len(stages), calls=tuple(calls)))
    return kinds


def predict_lab(lay: LabLayout, cost: StepCost) -> Prediction:
    """The planner's prediction of ``lay`` on this machine (``cost``: ``plan_machine``)."""
    return predict_here(LAB_GPT, lay.layout(), lay.training(), cost, lay.strategy,
                        lab_calls(lay))


def rank_lab(cost: StepCost, ranks: int | None = None) -> list[tuple[LabLayout, Prediction]]:
    """The lab's layouts (those of ``ranks`` ranks, or all), fastest predicted step first."""
    chosen = [lay for lay in LAYOUTS if ranks is None or lay.ranks == ranks]
    if not chosen:
        counts = sorted({lay.ranks for lay in LAYOUTS})
        raise ConfigError(f"ranks ({ranks}) must be one of the lab's layouts' rank counts "
                          f"{counts}; e.g. --gpus 4")
    pairs = [(lay, predict_lab(lay, cost)) for lay in chosen]
    return sorted(pairs, key=lambda pair: pair[1].step_s)
