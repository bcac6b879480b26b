"""The real runs behind each row: one warm ``labkit.Pool``, one short run per lesson's point.

Every check trains or communicates on real ranks (gloo on a CPU, NCCL with one GPU per rank
when there are enough GPUs) through the same ``labkit.run`` a notebook calls, reads the
run's metrics and hands the numbers to ``labkit.selftest.judge``. A warm pool
(``labkit.launchers.pool``) pays the ranks' start-up once for all of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from labkit.launchers.pool import Pool
from labkit.launchers.results import RunResult
from labkit.selftest import gpu, judge, judge_devices
from labkit.selftest.rows import Row, skipped
from labkit.selftest.sizes import Run, Sizes, mlp_weights


def whoami(ctx: Any) -> dict[str, Any]:
    """Run on every rank: who it is, in which process, on which device."""
    return {"rank": ctx.rank, "world_size": ctx.world_size, "pid": os.getpid(),
            "device": str(ctx.device)}


class Bench:
    """The pool, its backend and the sizes every check uses."""

    def __init__(self, pool: Pool, sizes: Sizes, gpus: int):
        self.pool, self.sizes, self.gpus = pool, sizes, gpus
        self.backend, self.world_size = pool.backend, pool.world_size

    def run(self, strategy: str, size: Run, **kw: Any) -> RunResult:
        args = {**size.kwargs(), **kw}
        if kw.get("options"):
            args["options"] = {**size.options, **kw["options"]}
        return self.pool.run(strategy=strategy, progress=False, timeout_s=300,
                             world_size=self.world_size, backend=self.backend, **args)


def ranks_start(b: Bench) -> list[Row]:
    t0 = time.perf_counter()
    out = b.pool.launch(whoami)
    return [judge.ranks_start(b.backend, b.world_size, list(out.results),
                              time.perf_counter() - t0)]


def ddp_reference(b: Bench) -> list[Row]:
    r = b.run("ddp", b.sizes.ddp, check_reference=True)
    return [judge.ddp_equals_one_process(b.backend, r.metrics["max_abs_diff_vs_reference"],
                                         r.config.steps)]


def ring(b: Bench, rounds: int = 5) -> list[Row]:
    """``rounds`` rounds of our ring then the backend's all-reduce, back to back: a round's
    pair shares the load of its moment (at load 4 here single runs swung 0.33-0.99 GB/s)."""
    pairs = []
    for _ in range(rounds):
        pair = []
        for impl in ("ring", "builtin"):
            r = b.pool.run(strategy="allreduce-bench", progress=False, world_size=b.world_size,
                           backend=b.backend, options={
                "impl": impl, "sizes": [b.sizes.ring_bytes], "iters": b.sizes.ring_iters,
                "warmup": 3})
            got = r.metrics["results"][0]
            pair.append({"time_s": got["time_s"], "busbw_gbps": got["busbw_gbps"]})
        pairs.append((pair[0], pair[1]))
    return [judge.ring_vs_builtin(b.backend, b.sizes.ring_bytes, b.world_size, pairs)]


def overlap(b: Bench) -> list[Row]:
    r = b.run("ddp-bucketed", b.sizes.bucketed)
    return [judge.bucketed_overlap(b.backend, r.metrics["overlap_fraction"],
                                   r.metrics["buckets"])]


BUBBLE_REPEATS = 3
"""Runs per schedule. Noise only ever adds idle time (a rank waiting for a core, a late
message), so the least bubble of a few alternated runs is the schedule's own: on the H200's
16 cores single GPipe runs read 0.238, 0.254 and 0.256 against 0.200."""


def bubbles(b: Bench, repeats: int = BUBBLE_REPEATS) -> list[Row]:
    seen: dict[str, list[dict[str, Any]]] = {"gpipe": [], "1f1b": []}
    for _ in range(repeats):  # alternated, so drift hits both schedules alike
        for schedule, runs in seen.items():
            runs.append(b.run("pipeline", b.sizes.pipeline, options={"schedule": schedule}).metrics)
    rows = []
    for schedule, runs in seen.items():
        m = runs[0]
        rows.append(judge.pipeline_bubble(b.backend, schedule, b.world_size, m["microbatches"],
                                          [r["bubble_fraction"] for r in runs],
                                          m["bubble_fraction_predicted"]))
    return rows


ZERO_RUNS = ((1, "fp32"), (2, "fp32"), (3, "fp32"), (2, "bf16"))
"""Stages 1-3 in fp32, and stage 2 in bf16 mixed precision (the paper's K = 12)."""


def zero(b: Bench) -> list[Row]:
    """ZeRO: bytes per rank vs the paper; on NCCL also the GPU's allocator peak (with fewer
    GPUs than ranks that row runs at N_d = 1 on one GPU: ``zero_one_gpu``)."""
    rows = []
    for stage, precision in ZERO_RUNS:
        before = gpu.reset_peaks(b.pool) if b.backend == "nccl" else None
        r = b.run("zero", b.sizes.zero, optimizer="adam",
                  options={"stage": stage, "precision": precision})
        rows.append(judge.zero_bytes(b.backend, stage, r.config.model.parameters(),
                                     b.world_size, precision, r.metrics["per_rank_bytes"]))
        if before is not None:
            rows.append(_zero_memory(b, r, stage, precision, before))
        elif b.gpus == 0:
            rows.append(skipped(judge.zero_key(stage, precision, "gpu_memory"), "05",
                                f"ZeRO-{stage} max_memory_allocated vs prediction ({precision})",
                                "nccl", gpu.why_not(b.gpus, b.world_size)))
    return rows


def zero_one_gpu(b: Bench) -> list[Row]:
    """ZeRO's allocator peak on one GPU (``b``: a one-rank NCCL pool): N_d = 1, where every
    stage keeps all the model states, so the row checks the allocator against the
    accounting; the sharding itself is checked to the byte by the gloo rows."""
    rows = []
    for stage, precision in ZERO_RUNS:
        before = gpu.reset_peaks(b.pool)
        r = b.run("zero", b.sizes.zero, optimizer="adam",
                  options={"stage": stage, "precision": precision})
        row = _zero_memory(b, r, stage, precision, before)
        row.check += ", one GPU, N_d = 1"
        rows.append(row)
    return rows


def _zero_memory(b: Bench, r: RunResult, stage: int, precision: str, before: list[int]) -> Row:
    """The allocator's peak during run ``r`` on the worst rank vs the model states + phases."""
    m, model = r.metrics, r.config.model
    peaks = gpu.read_peaks(b.pool)
    worst = max(range(b.world_size), key=lambda k: peaks[k] - before[k])
    return judge_devices.gpu_memory(
        stage, precision, peaks[worst] - before[worst],
        sum(judge.paper_zero_bytes(model.parameters(), b.world_size, stage,
                                   precision).values()),
        gpu.zero_phases(model, r.config.batch_size,
                        m["peak_model_state_bytes"][worst]
                        - sum(m["per_rank_bytes"][worst].values()),
                        m["saved_activation_bytes"][worst],
                        2 if precision == "bf16" else 4))


def tp(b: Bench) -> list[Row]:
    r = b.run("tp", b.sizes.tp)
    o = r.config.options
    pairs = {"both": 2, "mlp": 1, "attention": 1}[o.block]
    return [judge.tp_bytes(b.backend, r.config.batch_size, o.seq, o.hidden, pairs,
                           r.metrics["comm_bytes_per_layer_measured"])]


def mfu(b: Bench) -> list[Row]:
    r = b.run("ddp", b.sizes.mfu)
    m, model = r.metrics, r.config.model
    # the peak this run divided by, as the run reports it (labkit.analysis.throughput)
    age_min = m.get("peak_age_s", 0.0) / 60
    age = f"{age_min:.0f} min ago" if age_min < 120 else f"{age_min / 60:.0f} h ago"
    source = (f"{m.get('peak_source', 'labkit calibrate')}, best shape "
              f"{m.get('peak_shape') or '?'}, {age}")
    return [judge.mfu(b.backend, m.get("mfu"), m["flops_per_step"],
                      mlp_weights(model.in_dim, model.width, model.depth, model.out_dim),
                      r.config.batch_size * b.world_size, m.get("peak_flops_per_s"), source)]


RANK_CHECKS: tuple[Callable[[Bench], list[Row]], ...] = (
    ranks_start, ddp_reference, ring, overlap, bubbles, tp, zero, mfu)
"""In the order of the lessons; each returns its rows."""
