"""Claims of lessons 05-09 (ZeRO, communication, fault tolerance, 3D parallelism): see
``tests/notebooks/claims`` for what a check asserts and how timed claims are judged."""

from __future__ import annotations

from typing import Any

from tests.notebooks.claims.verdicts import judged, machine_load, timed


def lesson_05(ns: dict[str, Any]) -> None:
    """Each ZeRO stage keeps fewer model-state bytes per rank than the one before, within
    0.1% of the formula, stage 3 half of DDP's on 2 ranks; stages 0-2 send what DDP sends and
    stage 3 1.5x; every stage and FSDP2 train one process's weights; bf16 saves at most 0.55x
    fp32's activations and checkpointing at most 0.75x bf16's, and its step is longer (a verdict,
    ``judged``: the recomputed forward); the seed run fits its GPU; the
    hand-written ZeRO-1 matches labkit's; plain SGD's stage 1 saves nothing; the 3B GPT needs
    recomputation; fp16 without a loss scaler flushes its gradients to 0 and does not train."""
    from labkit.lessons.zero_text import model_states

    runs = ns["runs"]
    states = {k: model_states(r.metrics) for k, r in runs.items()}
    for name, (got, want) in states.items():
        assert abs(got - want) <= 1e-3 * want, f"{name}: measured {got:.0f} B, formula {want:.0f}"
    kept = [got for got, _ in states.values()]
    assert all(b < a for a, b in zip(kept, kept[1:])), kept
    assert abs(kept[3] / kept[0] - 0.5) < 0.01, f"stage 3 / DDP = {kept[3] / kept[0]:.3f}"
    comm = [r.metrics["comm_ratio_vs_ddp"] for r in runs.values()]
    assert [round(c, 3) for c in comm] == [1.0, 1.0, 1.0, 1.5], comm
    for name, r in {**runs, "FSDP2": ns["fsdp"]}.items():  # Adam: 3 steps, lr 0.01
        assert r.metrics["max_abs_diff_vs_reference"] < 5e-4, name
    from labkit.lessons.zero_text import peak_text

    # ZeRO-3's peak inside a step: what it keeps plus its largest layer gathered whole
    assert "exactly the largest layer gathered whole" in peak_text(runs["stage 3"])
    from labkit.lessons.zero_text import recompute_verdict

    judged([recompute_verdict(ns["mp"])], ns["said_precision"], label="recompute")
    act = {k: r.metrics["saved_activation_bytes"][0] for k, r in ns["mp"].items()}
    for r in [*ns["mp"].values(), ns["seed_run"]]:  # counted to the byte, the loss included
        m = r.metrics
        assert m["saved_activation_bytes"] == [m["predicted_activation_bytes"]] * len(
            m["saved_activation_bytes"]), m
    assert act["bf16"] <= 0.55 * act["fp32"] and act["bf16+ckpt"] <= 0.75 * act["bf16"], act
    capacity = 24e9 * ns["psi"] / 3e9
    per_rank = [sum(v for k, v in r.items() if k in ("params", "grads", "optimizer"))
                for r in ns["seed_run"].metrics["per_rank_bytes"]]
    assert max(per_rank) <= capacity, (per_rank, capacity)
    # the hand-written ZeRO-1 matched labkit's, with half the unsharded momentum per rank
    assert ns["zero1_check"], str(ns["zero1_check"])
    assert all(2 * m["optimizer bytes"] == 4 * ns["psi_small"] for m in ns["mine"]), ns["mine"]
    # plain SGD: stage 1 measured the same bytes as stage 0, stage 2 fewer
    kept = ns["sgd_kept"]
    assert kept[1] == kept[0] and kept[2] < kept[1], kept
    # the seed's 3B GPT: no stage fits without recomputation, full recomputation fits
    from labkit.theory import GPT_3B, fits
    assert not any(fits(3e9, gpus=4, gpu_gb=24, stage=s, shape=GPT_3B).fits for s in range(4))
    assert fits(3e9, gpus=4, gpu_gb=24, stage=2, shape=GPT_3B, recompute="full").fits
    # fp16: unscaled, (nearly) every gradient flushes to 0 and the loss stays; scaled, it trains
    plain, scaled = ns["fp16_plain"], ns["fp16_scaled"]
    assert min(plain["zero_share"]) > 0.9 > max(scaled["zero_share"]), (plain, scaled)
    assert plain["loss"][-1] > 0.9 * plain["loss"][0], plain["loss"]
    assert scaled["loss"][-1] < 0.3 * plain["loss"][-1], (plain["loss"], scaled["loss"])


def lesson_06(ns: dict[str, Any]) -> None:
    """The alpha-beta fit's verdict over three measurements is printed, with the missed size
    named when it does not hold (its small sizes are still too noisy here to hold on a quiet
    machine: issue 32); every compressor sends exactly its predicted bytes, fp16 2x, int8 about 4x
    and top-k (1%) about 50x fewer than none, over 40 trained steps; the hand-written top-k sent
    labkit's bytes; DDP's smallest buckets hide at least 0.1 more of their communication than one
    big bucket and the no-overlap alpha-beta step is within 1.5x of the measured one (verdicts,
    ``judged``), and tensor parallelism hides under 15%."""
    from labkit.lessons import comm_text as say

    assert len(ns["reports"]) == 3, ns["reports"]  # a verdict over three measurements
    fit = say.fit_verdict(ns["reports"])  # not held quiet yet (issue 32): its small sizes
    judged([fit], ns["said_fit"], label=None, may_miss_quiet=[fit])
    assert fit.holds or "missed the held-out" in ns["said_fit"], ns["said_fit"]
    rows = {r["method"]: r for r in ns["comp"]["rows"]}
    for name, r in rows.items():
        assert r["wire_bytes"] == r["predicted_wire_bytes"], (name, r)
    assert rows["fp16"]["ratio"] == 2.0 and 3.9 < rows["int8"]["ratio"] <= 4.0, rows
    assert 45 < rows["topk"]["ratio"] <= 50.1, rows["topk"]  # 1%: values + int32 positions
    assert all(len(curve) == 40 for curve in ns["comp"]["losses"].values())  # trained, not 5 steps
    mine, labkits = ns["both"][0]
    assert mine["bytes"] == labkits["bytes"] == 3 * 2 * 2 * 10 * 4, (mine, labkits)  # 3 steps, n=2, 2k
    judged([say.overlap_verdict(ns["rows"])], ns["said_overlap"], label="overlap")
    step = say.step_verdict(ns["pred"], ns["big"])  # a median of 2 steps: 43.1 +- 4.6 against
    judged([step], ns["said_step"], label="step", may_miss_quiet=[step])  # 20.3-45.6, 1 of 2 quiet
    tp = next(r for r in ns["rows"] if r["name"].startswith("tp"))
    assert tp["overlap_fraction"] < 0.15, tp


def lesson_07(ns: dict[str, Any]) -> None:
    """The hand-written resume and labkit's both end bit-identical to the uninterrupted run;
    so does torchrun's elastic restart; the crash at step 9 redid 9 mod 4 steps; the sentence
    names the longest red bar the figure draws; saving every 2 steps wrote 6 checkpoints and
    the interval text reads the saves' own durations; a 4-rank checkpoint loads on 2 exactly."""
    from labkit.base.events import Lane, Op
    from labkit.lessons.checkpoints import failure_text, interval_text

    assert ns["second"][0] == ns["reference"].params_sha256, "the hand-written resume differs"
    assert ns["resumed"].params_sha256 == ns["reference"].params_sha256
    assert ns["rep"]["params_sha256"] == ns["ref10"].params_sha256
    assert ns["story"].lost_steps == 9 % 4 == ns["steps_redone"](9, 4), ns["story"]
    tl = ns["failed"].timeline
    bars = [e for e in tl.events if e.lane == Lane.COMM and e.op != Op.WAIT and e.step in (7, 8, 9)]
    top = max(bars, key=lambda e: e.dur_ns)
    text = failure_text(tl, ns["failed"].rank, range(7, 10))
    assert f"rank {top.rank}'s {top.op.value} in step {top.step}," in text, text
    assert len(ns["every2"].metrics["checkpoints_saved"]) == 6, ns["every2"].metrics
    saves = ns["saves"]
    assert len(saves) == 3 and f"median of {len(saves)} saves" in interval_text(saves, ns["step_s"], 4)
    assert ns["r"]["max_abs_diff"] == 0.0


def lesson_09(ns: dict[str, Any]) -> None:
    """The grid written from arange(world).view(dp, pp, tp) gives labkit's coordinates and
    groups on 4 ranks; every layout equals one process and puts the predicted bytes on each
    axis (TP 8x the pipeline's on pp2 x tp2), its fullest rank the predicted model state;
    balancing by measured cost moves blocks off the heavy last stage and makes the slowest
    stage at least 10% faster (a verdict, ``judged``: a miss replayed and drawn)."""
    from labkit.lessons.mechanism import compare

    both = ns["both"]
    assert compare([b[0] for b in both], [b[1] for b in both], what="grid"), both
    lay, m = ns["layout"](1, 2, 2), ns["runs"]["pp2 x tp2"].metrics
    sent = m["comm_bytes_per_axis"]
    assert sent["tp"] / sent["pp"] == lay.traffic["tp"] / lay.traffic["pp"] == 8.0, sent
    fullest = max(sum(b[k] for k in ("params", "grads", "optimizer")) for b in m["per_rank_bytes"])
    assert fullest == lay.max_memory(), (fullest, lay.max_memory())
    for name, r in ns["runs"].items():
        assert r.metrics["max_abs_diff_vs_reference"] < 1e-5, name
        assert all(abs(v - 1) < 1e-6 for v in r.metrics["comm_ratio_per_axis"].values()), name
    count, cost = (ns["bal"][k].metrics for k in ("by block count", "by measured cost"))
    last = lambda m: m["stage_bounds"][-1] - m["stage_bounds"][-2]
    assert last(cost) < last(count), (count["stage_bounds"], cost["stage_bounds"])
    from labkit.lessons.parallel3d import stage_ms
    from labkit.lessons.parallel3d_balance import balance_verdict

    judged([balance_verdict(ns["bal"])], ns["said_balance"], label="balance")
    before, after = (max(stage_ms(ns["bal"][k])) for k in ("by block count", "by measured cost"))
    if machine_load().busy:  # quiet, 1 of 2 runs missed (11.3 -> 11.8 ms, 2026-11-29): the
        # verdict above judges the repeats; beside load the lesson must still say why
        timed(after < 0.9 * before, f"slowest stage {before:.1f} -> {after:.1f} ms",
              ns["said_balance"])
