"""The planner on this machine: the lab's own layouts, predicted from calibration, then run.

Teaches that one model of a step serves a laptop and a cluster: ``this_machine`` builds the
planner's cluster from what ``labkit calibrate`` measured (the fp32 matmul rate at the
layout's own GEMM shapes) and from the alpha-beta fitted to this machine's all-reduce
(``labkit.lessons.dedicated.machine_wire``), see ``labkit.theory.plan_local``. ``LAYOUTS``
are the runs of issue 38, item 4: ``labkit run hybrid`` over dp x pp x tp of 8 and 4 ranks,
and 2-rank DDP, ZeRO and pipeline, on the lesson GPT; ``predicted`` is the planner's step
time of one, ``measured`` the run's median step. ``bench/bench_plan_local.py`` alternates
them and prints the ratios.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from labkit.base import devices
from labkit.lessons.parallel3d import LESSON_GPT
from labkit.lessons.plan_lesson import lesson_decoder
from labkit.theory.plan import Prediction, predict
from labkit.theory.plan_local import gemm_rate, measured_cluster
from labkit.theory.plan_models import Cluster, Training
from labkit.theory.plan_terms import Layout

BATCH = 8
"""Sequences per data-parallel rank per step (labkit's ``batch_size``)."""


@dataclass(frozen=True, kw_only=True)
class LabLayout:
    """One of the lab's runs, as ``labkit.run`` takes it and as the planner sees it."""

    name: str
    """How the bench prints it."""
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
        return 2 if self.pp > 1 else 1

    def run_kwargs(self, steps: int) -> dict[str, Any]:
        """``labkit.run`` arguments of this layout on the lesson GPT."""
        by_strategy: dict[str, dict[str, Any]] = {
            "hybrid": {"dp": self.dp, "pp": self.pp, "tp": self.tp,
                       "microbatches": self.microbatches},
            "ddp": {}, "zero": {"stage": self.zero},
            "pipeline": {"microbatches": self.microbatches, "schedule": "1f1b"},
        }
        options = by_strategy[self.strategy]
        return {"strategy": self.strategy, "model": LESSON_GPT, "steps": steps,
                "batch_size": BATCH, "world_size": self.ranks, "options": options,
                "progress": False}

    def layout(self) -> Layout:
        return Layout(self.dp, self.tp, self.pp, BATCH // self.microbatches, self.microbatches,
                      zero=self.zero)


LAYOUTS = [LabLayout(name="hybrid dp2 x pp2 x tp2", strategy="hybrid", dp=2, pp=2, tp=2),
           LabLayout(name="hybrid pp2 x tp2", strategy="hybrid", pp=2, tp=2),
           LabLayout(name="hybrid dp2 x tp2", strategy="hybrid", dp=2, tp=2),
           LabLayout(name="hybrid dp2 x pp2", strategy="hybrid", dp=2, pp=2),
           LabLayout(name="ddp 2", strategy="ddp", dp=2),
           LabLayout(name="zero-1 2", strategy="zero", dp=2, zero=1),
           LabLayout(name="pipeline 2 (1F1B)", strategy="pipeline", pp=2)]


def gemm_shapes(lay: LabLayout) -> list[tuple[int, int, int]]:
    """The (m, k, n) matmuls of one rank's microbatch: forward, input and weight gradients of
    QKV, the output projection, the two MLP matrices (split by tp) and the head."""
    from labkit.train.data.text import vocab_size_of

    h, v = LESSON_GPT.width, vocab_size_of(LESSON_GPT.vocab_size)
    rows = BATCH // lay.microbatches * LESSON_GPT.seq_len
    t = lay.tp
    out: set[tuple[int, int, int]] = set()
    for k, n in ((h, 3 * h // t), (h // t, h), (h, 4 * h // t), (4 * h // t, h), (h, v)):
        out |= {(rows, k, n), (rows, n, k), (k, rows, n)}
    return sorted(out)


def calibrated_rate(lay: LabLayout) -> float:
    """The machine's matmul FLOP/s at ``lay``'s GEMM shapes (``labkit calibrate``'s cache;
    shapes not cached yet are measured now), with the threads its ranks use together."""
    from labkit.analysis.calibrate import calibrate

    threads = min(devices.cpu_count(), lay.ranks * devices.default_threads_per_rank(lay.ranks))
    shapes = gemm_shapes(lay)
    entry = calibrate("cpu", threads=threads, shapes=shapes, progress=False)
    if not entry:
        from labkit.base.errors import ConfigError

        raise ConfigError("no calibration of this machine: run `labkit calibrate` on a quiet "
                          "machine first, e.g. `labkit calibrate --refresh`")
    return gemm_rate(entry["rates"], shapes)


def one_rank_rate(steps: int = 8) -> float:
    """The rate a one-rank run of the lesson GPT reaches (model FLOPs per second of its
    median step, every core), as the planner's ``peak x MAMF``: divided by
    ``COMPUTE_EFFICIENCY``, so that the planner's compute term of that run is its step. The
    alternative to ``calibrated_rate`` for a model whose step is mostly not matmuls."""
    import labkit
    from labkit.theory.plan import COMPUTE_EFFICIENCY

    r = labkit.run(strategy="ddp", model=LESSON_GPT, world_size=1, batch_size=BATCH,
                   steps=steps, progress=False)
    return float(r.metrics["model_flops_per_s"]) / COMPUTE_EFFICIENCY


def this_machine(lay: LabLayout, wire: Any = None, rate: float | None = None) -> Cluster:
    """The planner's cluster for ``lay`` on this machine: the machine's rate (default
    ``calibrated_rate``) shared by its ranks, and the fitted wire."""
    from labkit.lessons.dedicated import machine_wire

    ab = wire or machine_wire(2)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    total = rate if rate is not None else calibrated_rate(lay)
    return measured_cluster(rate_flops_per_s=total / lay.ranks, alpha_s=ab.alpha_s,
                            bandwidth_Bps=ab.bandwidth_Bps, ranks=lay.ranks,
                            memory_bytes=float(memory))


def predicted(lay: LabLayout, net: Cluster) -> Prediction:
    """The planner's prediction of ``lay`` (fp32, momentum SGD, the lesson GPT)."""
    training = Training(global_batch_tokens=BATCH * lay.dp * LESSON_GPT.seq_len,
                        precision="fp32", optimizer="momentum", recompute="none")
    return predict(lesson_decoder(), net, training, lay.layout())
