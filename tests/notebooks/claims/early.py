"""Claims of lessons 00-04 (data parallelism, batch size, pipelines, tensor parallelism):
see ``tests/notebooks/claims`` for what a check asserts and how timed claims are judged."""

from __future__ import annotations

from typing import Any

from tests.notebooks.claims.verdicts import judged, timed


def lesson_00(ns: dict[str, Any]) -> None:
    """Two and four DDP ranks end with one process's weights (float rounding, < 1e-6), and
    the printed comparison covers both runs; one rank all-reduces 4 bytes per parameter;
    the hand-written loop trains labkit's weights bit for bit; the drawn steps are past
    warm-up (compute within 1.5x of the median step's)."""
    for name in ("result", "result4"):
        diff = ns[name].metrics["max_abs_diff_vs_reference"]
        assert diff < 1e-6, f"{name}: |w - one process| = {diff:g} >= 1e-6"
    text = ns["welcome_text"](ns["result"], ns["result4"])
    assert text.startswith("2 ranks:") and "\n4 ranks:" in text, text
    m = ns["result"].metrics
    assert m["bytes_per_step"] == 4 * m["num_params"], m
    assert all(r["params_sha256"] == ns["labkits"].params_sha256 for r in ns["mine"])
    from labkit.lessons.welcome import SETTLED, step_compute_ms

    compute = step_compute_ms(ns["result"].timeline)
    median = sorted(compute[s] for s in compute if s > 0)[(len(compute) - 1) // 2]
    assert all(compute[s] <= SETTLED * median for s in ns["shown"]), (ns["shown"], compute)


def lesson_01(ns: dict[str, Any]) -> None:
    """The ring sends 2(n-1)/n x S per rank (within one chunk's rounding); DDP equals one
    process; buckets hide communication that the naive variant leaves exposed; without a
    DistributedSampler every sample is loaded twice, with one none; SyncBatchNorm equals
    one process where BatchNorm does not; the bucket hooks (yours and labkit's) launch an
    all-reduce before backward ends (counted); the roofline's compute grows with the batch."""
    ring, runs, demo = ns["ring"], ns["runs"], ns["demo"]
    sent = ring["bytes_sent"][-1]
    assert max(abs(b - ring["predicted_bytes_per_rank"]) for b in sent) <= 4 * 3, sent
    assert runs["ddp-naive"].metrics["max_abs_diff_vs_reference"] < 1e-6
    assert runs["ddp-naive"].metrics["overlap_fraction"] == 0.0
    assert runs["ddp-bucketed"].metrics["overlap_fraction"] > 0.05
    report = ns["duplicate_report"]
    assert report([r["no_sampler"] for r in demo])["duplicate_fraction"][0] == 0.5
    assert report([r["correct"] for r in demo])["duplicate_fraction"][0] == 0.0
    assert demo[0]["syncbatchnorm"]["max_abs_diff_vs_reference"] < 1e-5
    assert demo[0]["batchnorm"]["max_abs_diff_vs_reference"] > 1e-3
    from labkit.lessons.dp_lesson import launched_in_backward

    for step in (0, 1):  # the hand-written hook and labkit's: a bucket left during backward
        counts = launched_in_backward(ns["hook_run"].timeline, step)
        assert all(k >= 1 and n > 1 for k, n in counts.values()), (step, counts)
    from labkit.lessons.dp_roofline import roofline_verdicts
    from labkit.lessons.dp_verdicts import bucket_verdicts, scaling_verdict, speedup_verdict

    hidden, faster = bucket_verdicts(ns["sweep"])  # a shorter step needs a core for gloo's
    judged([hidden, faster], ns["said_buckets"], label="buckets",  # threads: quiet, 2 cores
           may_miss_quiet=[faster])  # measured it contradicted (docs/benchmarks.md, issue 32)
    scal, predicted = ns["scal"], ns["predicted"]
    weak = {n: scaling_verdict(scal, predicted, n) for n in scal if n > 1}
    judged(list(weak.values()), ns["said_scaling"], label="weak scaling",  # quiet, 2 ranks:
           may_miss_quiet=list(weak.values()))  # 5 of 5 runs missed on 2026-11-29 (27.9-
    # 33.3 ms against bands topping at 14.3-20.2): the ten calls a step took 20.5-23.9 ms
    # against 6.4-8.3 for their bytes, the median call 2-3x the bench's. Each call now also
    # pays the bench's mean stall: quiet, 2 hold and 6 inconclusive in 8 runs, none
    # contradicted; its 3 steps' spread is +-10-63 % (docs/benchmarks.md, 2026-11-30)
    two = weak.get(2)  # a 2-rank step above its prediction is explained call by call
    if two is not None and not two.holds and scal[2].step_time_s > predicted[2]:
        assert "all-reduces a step took" in ns["said_scaling"], ns["said_scaling"]
    judged([speedup_verdict(ns["amdahl"])], ns["said_amdahl"], label="strong scaling")
    floor, above, flat = roofline_verdicts(ns["roof"])  # gloo's all-reduce is bimodal here
    judged([floor, above, flat], ns["said_roof"], label=None,  # (0.4 or 0.9 ms, 1.3 or 2.9 ms
           may_miss_quiet=[floor, flat])  # sweep to sweep): a ratio on it reads +-50 % quiet;
    # batch 4's compute is memory-bound: alone in one process on the AVX2 host it took 2.1-6 ms
    # a call within a minute, and the floor's check read 1.00 +- 0.41 quiet (2026-12-01)
    roof = ns["roof"]  # 256x the samples: compute grows, at least 8x (a CPU's fixed costs)
    comp = roof.least("compute")
    timed(comp[-1] > 8 * comp[0], f"compute at batch {roof.batches[-1]} {comp[-1] * 1e3:.2f} ms, "
                                   f"at batch {roof.batches[0]} {comp[0] * 1e3:.2f} ms")


def lesson_02(ns: dict[str, Any]) -> None:
    """At equal samples, unscaled N-rank training ends above linear scaling; 16x the LR
    diverges and clipping keeps it finite; accumulation equals the big batch; the noise scale
    grows as the loss falls and lies between the lesson's batch 64 and 1024; the resized run
    used the rule's LR; LARS beats momentum SGD at batch 1024 on every seed, as printed."""
    from labkit.lessons.large_batch_text import race_text
    from labkit.theory import lr_after_resize

    rows = {r["run"]: r for r in ns["exp"].table()}
    unscaled = next(r for k, r in rows.items() if "unscaled" in k)
    linear = next(r for k, r in rows.items() if "linear scaling" in k)
    assert unscaled["final_loss"] > linear["final_loss"] + 0.1, (unscaled, linear)
    assert next(r for k, r in rows.items() if k.endswith("too large"))["diverged"]
    assert not next(r for k, r in rows.items() if "clipping" in k)["diverged"]
    assert ns["acc"]["max_abs_diff"] < 1e-6, ns["acc"]
    noise = ns["ns"]
    half = len(noise.losses) // 2
    early, late = noise.b_simple(0, half), noise.b_simple(half)
    assert late > 1.3 * early, f"B_simple {early:.0f} -> {late:.0f}: did not grow as the loss fell"
    assert 64 < late < 1024, f"B_simple {late:.0f} not between the lesson's batches 64 and 1024"
    rz = ns["rz"]
    assert rz["batch_after"] * 2 == rz["batch_before"] and rz["resumed_from"] > 0, rz
    want = lr_after_resize(rz["lr_before"][-1], rz["old_world"], rz["new_world"])
    assert all(abs(lr - want) < 1e-12 for lr in rz["lr_after"]), (rz["lr_after"], want)
    race = ns["race"]
    gaps = race.gaps()
    assert len(gaps) >= 3 and race.lars_wins(), f"SGD - LARS final loss per seed at batch 1024: {gaps}"
    assert "it holds here" in race_text(race)


def lesson_03(ns: dict[str, Any]) -> None:
    """The naive pipeline idles at least 0.4 of its step (predicted 0.5); the bubble at m = 1,
    4 and 8, judged over three alternated repeats, holds what its own stages give the plan
    on a quiet machine (a miss is replayed in the lesson's words); 8 microbatches shrink it;
    every rank held exactly its plan's activations, 1F1B fewer than GPipe on rank 0; interleaving sends
    (v*p-1)/(p-1) times 1F1B's messages; zero bubble ran I and W apart; balancing by cost took
    layers off the heavy last stage. Each timed sentence is a verdict (``judged``: no "holds"
    for numbers that miss, every miss replayed on dedicated cores and drawn). The
    1F1B loop on the page equals labkit's executor and holds p - r microbatches on rank r.
    labkit's GPipe and 1F1B train the weights torch.distributed.pipelining's schedules train
    (float rounding: <= 1e-6)."""
    for schedule, twin in ns["twins"].items():
        assert twin["max_abs_diff"] <= 1e-6, (f"{schedule}: labkit vs torch's schedule differ by "
                                              f"{twin['max_abs_diff']:.2e}")
    from labkit.strategies.pipeline.metrics import op_times_ms

    naive, gpipe = ns["naive"].metrics, ns["gpipe"].metrics
    one_f, inter = ns["one_f"].metrics, ns["inter"].metrics
    assert naive["bubble_fraction"] >= 0.4, f"naive bubble {naive['bubble_fraction']:.2f} < 0.4"
    from labkit.lessons import pipeline_text as say
    from labkit.lessons.pipeline_replays import balance_verdict

    sweep = ns["sweep"]
    assert sorted(sweep) == [1, 4, 8] and all(len(runs) == 3 for runs in sweep.values())
    sweep_verdicts = say.sweep_verdicts(sweep)
    # each m is judged against its own stages (the last stage carries the head and the loss):
    # in ten quiet sweeps m = 8 held 2 times against equal stages, 10 against its own, and m = 4
    # 9 and 10. Both may still miss quiet: at 64 rows a microbatch m = 8's messages add
    # 0.024-0.029 (bubble_breakdown's "communication", 4 quiet runs), and of four quiet notebook
    # runs one read m = 8 at 0.170 +- 0.012 against 0.116 +- 0.05 and one m = 4 at 0.167 +- 0.036
    # (a repeat below even equal stages' 0.20: its spans stretched) (docs/benchmarks.md, 2026-12-01)
    edges = [v for v in sweep_verdicts if v.what in ("the bubble at m=4", "the bubble at m=8")]
    judged(sweep_verdicts, ns["said_sweep"], label="bubble sweep", may_miss_quiet=edges)
    for m in sweep:  # a missed bubble also says what uneven actions and messages added
        v = say.formula_verdict(sweep[m], f"the bubble at m={m}")
        assert v.holds or f"m={m} replayed with this run's own action times" in ns["said_sweep"]
    pair, il, zbr = ns["pair"], ns["il"], ns["zbr"]
    same = say.same_bubble_verdict(pair["gpipe"], pair["1f1b"])  # quiet, 2026-12-01: 2 of 5
    judged([same], ns["said_pair"], label="gpipe vs 1f1b",  # notebook runs inconclusive
           may_miss_quiet=[same])  # (0.036 +- 0.047, -0.019 +- 0.062), 7 of 8 pairs alone held
    # (benchmarks.md): one pair's two bubbles move 0.02-0.04 apart, and neither plan's stages
    # explain it
    judged([say.interleave_verdict(il["1f1b"], il["interleaved"])], ns["said_inter"],
           label="interleaving")
    zb = say.zero_bubble_verdict(zbr["1f1b"], zbr["zb"])  # both inconclusive in 1 of 3 quiet
    judged([zb], ns["said_zb"], label="zero bubble", may_miss_quiet=[zb])  # runs: 1.08 +- 0.09,
    balance = balance_verdict(ns["runs"], ns["balance_reps"])  # 1.01 +- 0.19 (benchmarks.md)
    judged([balance], ns["said_balance"], label="balance", may_miss_quiet=[balance])
    for m in (gpipe, one_f):
        assert m["peak_activations"] == m["peak_activations_predicted"], m["schedule"]
    assert one_f["peak_activations"][0] < gpipe["peak_activations"][0]
    p, v = inter["stages"], inter["virtual"]
    ratio = inter["p2p_messages_per_step"] / one_f["p2p_messages_per_step"]
    assert ratio == (v * p - 1) / (p - 1), f"interleaved / 1F1B messages {ratio}"
    ops = op_times_ms(ns["zb"].timeline.events)
    assert {"backward_input", "backward_weight"} <= set(ops) and "backward" not in ops, ops
    bounds = {k: r.metrics["stage_bounds"] for k, r in ns["runs"].items()}
    last = {k: b[-1] - b[-2] for k, b in bounds.items()}
    assert last["by measured cost"] < last["by layer count"], bounds
    from labkit.lessons.mechanism import compare

    both = ns["both"]  # the 1F1B loop on the page, as the lesson wrote it
    assert compare([b[0] for b in both], [b[1] for b in both], what="1F1B", atol=1e-9)
    assert [b[0]["peak_held"] for b in both] == [2, 1], "rank r holds p - r microbatches"


def lesson_04(ns: dict[str, Any]) -> None:
    """The sharded blocks compute the unsharded function (< 1e-5); each rank keeps 1/2 of
    the parameters plus the replicated few (under 52%); the bytes of every layer equal the
    prediction; under 15% of the all-reduce time hides; DTensor's MLP issues one all-reduce
    forward and one backward; f and g on the page equal labkit's; a step issues 4 all-reduces
    per layer."""
    m = ns["tp"].metrics
    diffs = {k: m[k] for k in ("max_abs_diff_output", "max_abs_diff_loss",
                               "max_abs_diff_vs_reference")}
    assert max(diffs.values()) < 1e-5, diffs
    share = m["params_per_rank"] / m["params_full"]
    assert 0.5 <= share < 0.52, f"each rank keeps {share:.3f} of the parameters"
    want = m["comm_bytes_per_layer_predicted"]
    assert m["comm_bytes_match"] and all(
        layer == want for layer in m["comm_bytes_per_layer_measured"]), m
    assert m["overlap_fraction"] < 0.15, f"TP hid {m['overlap_fraction']:.0%} of its comm"
    assert m["dtensor"]["comm_counts"] == {"all_reduce": 2}, m["dtensor"]
    from labkit.lessons.mechanism import compare
    from labkit.lessons.tp_text import allreduces_in_step

    both = ns["both"]  # Megatron's f and g on the page, as the lesson wrote them
    assert compare([b[0] for b in both], [b[1] for b in both], what="f/g", atol=1e-6)
    count = allreduces_in_step(ns["tp"], step=2)
    assert count == 2 * 4, f"rank 0 issued {count} all-reduces in step 2, not 2 layers x 4"
