"""One-call helpers lesson 09 uses: real 3D runs and the predictions beside them, as rows.

Sized for a 2-core laptop: a small GPT (width 64, 4 blocks, 32 tokens), a few steps, 4
ranks. Four ranks on two cores take turns, so timings include waiting for a core; bytes,
memory and the equality with one process do not depend on it. Figures live in
``labkit.visuals.parallel3d``.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from labkit.api import run
from labkit.base.progress import each
from labkit.config.run import ModelConfig
from labkit.launchers.results import RunResult
from labkit.lessons.machine import load_now, sharing_cores, why_not
from labkit.lessons.parallel3d_balance import balance_again, balance_verdict, stage_ms
from labkit.theory import Layout3D, parallel_layout
from labkit.theory.comm import alpha_beta_time
from labkit.theory.interconnect import get_link

LESSON_GPT = ModelConfig(kind="gpt", width=64, depth=4, heads=4, seq_len=32)
BATCH, MICROBATCHES = 8, 2


def run_3d(dp: int = 1, pp: int = 1, tp: int = 1, *, zero_stage: int = 0, steps: int = 3,
           model: ModelConfig = LESSON_GPT, batch_size: int = BATCH,
           microbatches: int = MICROBATCHES, **run_kwargs: Any) -> RunResult:
    """Train the lesson GPT on a dp x pp x tp grid of real ranks (a bar where one can see it,
    as ``labkit.run``'s, unless ``progress=False``)."""
    with sharing_cores():  # 4 ranks on a 2-core laptop: the lesson says so, once
        return run(strategy="hybrid", model=model, steps=steps, batch_size=batch_size,
                   options={"dp": dp, "pp": pp, "tp": tp, "microbatches": microbatches,
                            "zero_stage": zero_stage}, **run_kwargs)


def factorisations(world_size: int, model: ModelConfig = LESSON_GPT) -> list[tuple[int, int, int]]:
    """Every (dp, pp, tp) with dp x pp x tp = world_size that the model allows."""
    out = []
    for tp in range(1, world_size + 1):
        for pp in range(1, world_size // tp + 1):
            dp, rest = divmod(world_size, tp * pp)
            if rest == 0 and model.heads % tp == 0 and model.width % tp == 0 \
                    and pp <= model.depth:
                out.append((dp, pp, tp))
    return out


def layout(dp: int, pp: int, tp: int, *, model: ModelConfig = LESSON_GPT,
           zero_stage: int = 0, optimizer: str = "momentum", batch_size: int = BATCH,
           microbatches: int = MICROBATCHES) -> Layout3D:
    """``labkit.theory.parallel_layout`` for the lesson GPT (the prediction of a run)."""
    from labkit.train.data.text import vocab_size_of

    return parallel_layout(kind=model.kind, width=model.width, depth=model.depth,
                           heads=model.heads, seq_len=model.seq_len,
                           vocab=vocab_size_of(model.vocab_size), dp=dp, pp=pp, tp=tp,
                           microbatches=microbatches, batch_size=batch_size,
                           zero_stage=zero_stage, optimizer=optimizer)


def layout_rows(world_size: int, **kwargs: Any) -> list[dict[str, Any]]:
    """One row per factorisation: the fullest rank's model state and bytes per axis."""
    rows = []
    for dp, pp, tp in factorisations(world_size, kwargs.get("model", LESSON_GPT)):
        lay = layout(dp, pp, tp, **kwargs)
        rows.append({"layout": f"dp{dp} x pp{pp} x tp{tp}", "max_state_MB": lay.max_memory() / 1e6,
                     **{f"{a}_MB": lay.traffic[a] / 1e6 for a in ("dp", "pp", "tp")}})
    return rows


def axis_rows(result: RunResult) -> list[dict[str, Any]]:
    """Measured vs predicted wire bytes per step on each axis of a hybrid run."""
    m = result.metrics
    return [{"axis": a, "measured_MB": m["comm_bytes_per_axis"][a] / 1e6,
             "predicted_MB": m["predicted_comm_bytes_per_axis"][a] / 1e6,
             "ratio": m["comm_ratio_per_axis"][a]} for a in ("dp", "pp", "tp")]


def link_seconds(lay: Layout3D, inside: str = "nvlink4", across: str = "ethernet_25g"
                 ) -> list[dict[str, Any]]:
    """What each axis's traffic per step would cost one rank on a fast link inside a node
    and on a slow link between nodes: messages x latency + bytes / bandwidth (alpha-beta)."""
    rows = []
    for axis, total in lay.traffic.items():
        per_rank, calls = total / lay.world_size, lay.calls.get(axis, 0)
        row: dict[str, Any] = {"axis": axis, "messages": calls, "MB_per_rank": per_rank / 1e6}
        for name in (inside, across):
            link = get_link(name)
            row[f"ms_on_{name}"] = 1e3 * alpha_beta_time(calls, per_rank, link.alpha_s,
                                                         link.bandwidth_Bps)
        rows.append(row)
    return rows


BALANCE_GPT = replace(LESSON_GPT, vocab_size=8192)
"""Lesson 09's uneven-stage model: the lesson GPT's 4 blocks and an 8,192-word-piece head, a
``width x vocab`` matmul on the last stage that costs one to two blocks' worth of compute on
a laptop CPU (``head_blocks`` reads it off the run): equal block counts give that stage 2
blocks and the head, balancing by cost moves one block off it (with 4 blocks and 2 stages
there is no cut that overshoots further)."""
BALANCE_GAIN = 0.10
"""How much faster the slowest stage gets when the cut follows measured cost (the lesson's
margin: the heavy head moves a whole block off the last stage)."""


def balance_runs(pp: int = 2, *, model: ModelConfig = BALANCE_GPT, steps: int = 6,
                 **run_kwargs: Any) -> dict[str, RunResult]:
    """The GPT with a large word vocabulary (a heavy head on the last stage), split by block
    count and by measured cost (rank 0 times each block on one microbatch, the head's time
    added to the last block, and every rank cuts where those costs balance)."""
    out = {}
    for label, balance in each((("by block count", "count"), ("by measured cost", "cost")),
                               "pipeline balance", name=lambda v: v[0]):
        run_kwargs.setdefault("progress", False)
        out[label] = run(strategy="pipeline", model=model, world_size=pp, steps=steps,
                         batch_size=BATCH, options={"schedule": "1f1b",
                                                    "microbatches": 4, "balance": balance},
                         **run_kwargs)
    return out


def head_blocks(result: RunResult) -> dict[str, float]:
    """What the last stage's extra work (final LayerNorm and head) cost, in blocks, read from
    a run split by block count: a block's time is the first stage's time over its blocks
    (the embedding is a table lookup, no matmul), the head's the last stage's time minus its
    own blocks'. Keys: ``block_ms``, ``head_ms``, ``blocks`` (head_ms / block_ms)."""
    bounds = result.metrics["stage_bounds"]
    ms = stage_ms(result)
    block = ms[0] / max(1, bounds[1] - bounds[0])
    head = ms[-1] - block * (bounds[-1] - bounds[-2])
    return {"block_ms": block, "head_ms": head, "blocks": head / block if block > 0 else 0.0}


def head_text(result: RunResult) -> str:
    """The head's cost in blocks, as this run measured it, in one sentence."""
    h = head_blocks(result)
    if h["head_ms"] <= 0:
        return (f"the last stage was no slower than its blocks alone ({h['block_ms']:.1f} ms a "
                f"block): in this run the head's cost is lost in the noise")
    return (f"in this run a block took {h['block_ms']:.1f} ms per microbatch and the head "
            f"{h['head_ms']:.1f} ms: the head costs about {h['blocks']:.1f} blocks")


def balance_text(runs: dict[str, RunResult]) -> str:
    """What the head cost, where each split cut, the slowest stage's time (its least
    disturbed step) and the step, and what moved."""
    count, cost = runs["by block count"].metrics, runs["by measured cost"].metrics
    times = {label: stage_ms(r) for label, r in runs.items()}
    lines = [head_text(runs["by block count"])]
    for label, m, r in (("by block count", count, runs["by block count"]),
                        ("by measured cost", cost, runs["by measured cost"])):
        ms = times[label]
        lines.append(f"{label:<17} cuts {m['stage_bounds']}  stage ms "
                     f"{[round(t, 1) for t in ms]}  slowest {max(ms):.1f} ms  step "
                     f"{r.step_time_s * 1e3:.0f} ms")
    moved = [b - a for a, b in zip(count["stage_bounds"], cost["stage_bounds"])]
    if moved == [0] * len(moved):
        lines.append("the measured cost cut where the block count does: the head is not heavy "
                     "enough here to move a block")
        return "\n".join(lines)
    blocks = [b - a for a, b in zip(cost["stage_bounds"], cost["stage_bounds"][1:])]
    lines.append(f"balancing by cost moved the cut: blocks per stage {blocks} instead of "
                 f"{[b - a for a, b in zip(count['stage_bounds'], count['stage_bounds'][1:])]}"
                 f" (the last stage also runs the head)")
    before, after = max(times["by block count"]), max(times["by measured cost"])
    verdict = balance_verdict(runs)
    lines.append(verdict.sentence())
    if verdict.holds:
        lines.append(f"the slowest stage went from {before:.1f} to {after:.1f} ms per microbatch "
                     f"({1 - after / before:.0%} less): every stage waits for the slowest one")
    else:
        lines.append("  " + balance_again(runs, verdict))
        lines.append(f"the slowest stage went from {before:.1f} to {after:.1f} ms in this run, "
                     f"where balancing gains {BALANCE_GAIN:.0%} or more on a quiet machine: "
                     + why_not(load_now(), 2))
    return "\n".join(lines)


def project_text(rows: list[dict[str, Any]]) -> str:
    """Seed 000's project in one sentence per world size, read from the runs."""
    lines = []
    for r in rows[1:]:
        n, speedup = r["ranks"], r["speedup"]
        lines.append(f"{n} ranks trained {speedup:.2f}x the samples per second of 1 rank "
                     f"(ideal {n}x), to {r['accuracy']:.1%} held-out accuracy")
        if speedup < 0.75 * n:
            lines.append(f"far from {n}x: each step spends {r['comm_share']:.0%} of its time in "
                         f"communication that no compute hides -- a tiny model's all-reduce "
                         f"costs about as much as its compute")
        elif speedup > n:
            lines.append(f"more than {n}x: the 1-rank run was slower per sample than a rank of "
                         f"the 2-rank run, which on a laptop means it waited for a core: "
                         + why_not(load_now(), n))
        one = rows[0]  # the same steps, but every rank takes a batch of its own each step
        if r["samples_seen"] != one["samples_seen"] and abs(r["accuracy"] - one["accuracy"]) >= 5e-4:
            lines.append(f"why the accuracies differ ({r['accuracy']:.1%} against 1 rank's "
                         f"{one['accuracy']:.1%}): every rank takes a batch of its own each step, "
                         f"so in the same steps {n} ranks trained on {r['samples_seen']:,} "
                         f"samples and 1 rank on {one['samples_seen']:,}; one process on "
                         f"{n} ranks' global batch would train these weights (to float rounding)")
    return "\n".join(lines)


def mfu_text(metrics: dict[str, Any]) -> str:
    """What the MFU column is measured against on this machine, beside a GPU's."""
    peak = metrics.get("peak_flops_per_s")
    if not peak:
        return "MFU: this machine's peak is not measured yet (`labkit calibrate`)"
    return (f"MFU here = model FLOP/s / {peak / 1e9:.0f} GFLOP/s, the fp32 matmul peak measured "
            f"on this machine's cores (labkit.analysis.calibrate); on a GPU it is the "
            f"datasheet's peak, e.g. 989 TFLOP/s of dense bf16 on an H100 SXM")


def mfu_runs_text(runs: dict[str, RunResult]) -> str:
    """The share of the peak these runs reached, split in two: how much of a step the ranks
    computed (the timeline's compute share) and how fast they ran while they did (MFU over
    that share). Both read this run's numbers; no sentence is written in advance."""
    from labkit.lessons.dp_lesson import step_split_ms

    rows, missing = [], []
    for name, r in runs.items():
        mfu = r.metrics.get("mfu")
        if mfu is None:
            missing.append(f"{name}: MFU " + (r.metrics.get("mfu_note") or "not reported (no "
                                              "measured peak on this machine)"))
            continue
        if r.step_time_s <= 0:
            missing.append(f"{name}: MFU {mfu:.3f}, with no timed step to split it over")
            continue
        share = min(1.0, step_split_ms(r)["compute_ms"] / (r.step_time_s * 1e3))
        rows.append((name, mfu, share, mfu / share if share > 0 else 0.0))
    if not rows:
        return "\n".join(missing)
    lo, hi = min(r[1] for r in rows), max(r[1] for r in rows)
    c_lo, c_hi = min(r[2] for r in rows), max(r[2] for r in rows)
    w_lo, w_hi = min(r[3] for r in rows), max(r[3] for r in rows)
    lines = [f"these runs reached MFU {lo:.3f} to {hi:.3f}: {lo:.1%} to {hi:.1%} of the peak",
             f"their ranks computed for {c_lo:.0%} to {c_hi:.0%} of a step (the rest: "
             f"communication, the bubble, waiting for a core), and while computing ran at "
             f"{w_lo:.0%} to {w_hi:.0%} of the peak"]
    if w_hi < 0.5:
        lines.append(f"even the compute is far from the peak: a width-{LESSON_GPT.width} GPT's "
                     f"matmuls are small beside the peak's best shape, and a block's LayerNorms, "
                     f"softmax and Python run between them")
    else:
        lines.append("the compute itself runs near the peak: what MFU loses is the step's time "
                     "outside compute")
    return "\n".join(lines + missing)


def rows_text(rows: list[dict[str, Any]]) -> str:
    """A list of dicts as an aligned text table (numbers to 3 significant digits)."""
    if not rows:
        return ""
    keys = list(rows[0])
    cells = [[k for k in keys]] + [[f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                                    for k in keys] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(keys))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) for i in range(len(keys))) for c in cells)


def project_rows(runs: dict[int, RunResult]) -> list[dict[str, Any]]:
    """Seed 000's project (a classifier made data parallel): speedup over one rank,
    utilisation (shares of one step computing and in exposed communication, and MFU),
    held-out accuracy and the samples trained on (every rank takes its own batch each step),
    per world size."""
    from labkit.lessons.dp_lesson import step_split_ms

    one = runs[min(runs)].metrics["samples_per_s"]
    rows = []
    for n, r in sorted(runs.items()):
        m = r.metrics
        # both shares of the same steps (all but the first; compute and exposed comm a mean
        # over ranks) over those steps' mean span, so they add up to at most 1 (over the
        # median step, a run with one slow step read 0.47 + 0.65); what is left of the step
        # is waiting (idle, the optimizer, Python)
        split = step_split_ms(r)
        spans = r.timeline.window().step_times_s()
        step_ms = (statistics.fmean(spans) if spans else r.step_time_s) * 1e3 or 1.0
        rows.append({"ranks": n, "samples_per_s": m["samples_per_s"],
                     "speedup": m["samples_per_s"] / one,
                     "compute_share": split["compute_ms"] / step_ms,
                     "comm_share": split["exposed_ms"] / step_ms,
                     "mfu": m.get("mfu", 0.0), "accuracy": m["accuracy"],
                     "samples_seen": int(m["samples_per_step"]) * r.config.steps})
    return rows
