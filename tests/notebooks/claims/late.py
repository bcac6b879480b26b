"""Claims of lessons 10-14 (multi-node, parameter servers, Ray, the planner, long sequences):
see ``tests/notebooks/claims`` for what a check asserts and how timed claims are judged."""

from __future__ import annotations

from typing import Any

from tests.notebooks.claims.verdicts import judged, timed


def lesson_10(ns: dict[str, Any]) -> None:
    """The hierarchical all-reduce written on the page sums what labkit's hierarchical one and
    its flat ring sum, and sends 1.0x the tensor out of each node where the flat ring sends
    1.5x (counted from the trace); across the link TP is never predicted below TP measured
    inside one node (nor the pipeline below its own), and the link slows TP more than the
    pipeline, and more of a DDP step is lost across nodes than inside one (each a verdict that
    says "holds" only for numbers that hold, and draws its replay when it does not), as do
    weak scaling's efficiency (at most 1) and the DDP step predicted across each link (within
    1.5x); every link delivers its shaped rate within 5 % (``RATE_TOLERANCE``), or the
    lesson says which probe waited for a core."""
    from labkit.lessons.mechanism import compare

    sums, uplink, size = ns["sums"], ns["uplink"], 4 * ns["NUMEL"]
    for k in (1, 2):
        assert compare([s[0] for s in sums], [s[k] for s in sums], what="sum"), k
    assert uplink["yours"] == uplink["labkit's hierarchical"] == [1.0 * size] * 2, uplink
    assert uplink["flat ring"] == [1.5 * size] * 2, uplink
    from labkit.lessons.cluster_ddp import (
        predicted_rows,
        prediction_verdicts,
        weak_scaling_verdicts,
    )

    ddp = ns["ddp"]
    predicted = prediction_verdicts(ddp)
    # torch DDP hides part of its all-reduce under the backward; the prediction charges all of
    # it (no overlap), so a fast link's step lands under it -- infiniband_hdr at about 0.8x,
    # its fastest step's noise crossing the band's low edge in 3 of 8 quiet runs (and 3 of
    # 3 before; e.g. 19.7 +- 3.6 against 16.3-36.7 ms: docs/benchmarks.md); a step above its
    # prediction must still hold quiet
    under = [v for v, r in zip(predicted, predicted_rows(ddp), strict=True)
             if v.sample.value < r["predicted_step_s"] * 1e3]
    judged(weak_scaling_verdicts(ddp) + predicted, ns["said_ddp"], label="ddp",
           may_miss_quiet=under)
    rows = ns["place"]["rows"]
    inside = {r["strategy"]: r for r in rows if r["where"].startswith("inside")}
    across = {r["strategy"]: r for r in rows if not r["where"].startswith("inside")}
    for name in ("tp", "pipeline"):
        assert across[name]["predicted_step_s"] >= inside[name]["step_s"], name
    if across["tp"]["slowdown"] is not None:  # an emulated cluster ran here
        from labkit.lessons.cluster_text import (
            RATE_TOLERANCE,
            compression_verdicts,
            hierarchical_verdicts,
            overhead_verdict,
            placement_verdict,
        )

        v = placement_verdict(across["tp"]["slowdown"], across["pipeline"]["slowdown"])
        judged([v], ns["placed"], label="placement")
        over = ns["overhead"]
        judged([overhead_verdict(over)], ns["said_overhead"], label="overhead")
        judged(hierarchical_verdicts(ns["hier"]), ns["said_hier"], label=None)
        judged(compression_verdicts(ns["comp"]), ns["said_comp"], label="compression")
        off = [f"{r['link']} {r['rate_error']:+.1%}" for r in ns["links"]
               if abs(r["rate_error"]) > RATE_TOLERANCE]
        timed(not off, f"links off their shaped rate: {', '.join(off)}", said=ns["said_links"])


def lesson_11(ns: dict[str, Any]) -> None:
    """With a straggler, ASP handles at least 1.5x BSP's gradients per second while every
    worker computes (predicted 2.5), reaches the target loss first, and the printed verdicts
    say so (a miss drawn beside its replay); BSP stays synchronous SGD and SSP within its
    bound. The server on the page ends with labkit's server's exact weights and puts
    2 x W x 4N bytes through rank 0 per step."""
    mech, w = ns["mech"], ns["w"]
    assert mech.weights_sha256(w) == ns["labkits"].params_sha256, "the page's server != labkit's"
    moved, sent = mech.server_bytes(ns["mine"]), ns["server_bytes_per_step"](2, ns["params"])
    assert moved == sent, f"server bytes per step: traced {moved}, predicted {sent}"
    ps, exp = ns["ps"], ns["exp"]
    rows = {r["quantity"]: r for r in ps.straggler_predictions(exp)}
    ratio = rows["ASP / BSP gradients per second"]["measured"]
    timed(ratio >= 1.5, f"ASP / BSP gradients per second {ratio:.2f} < 1.5 (predicted 2.5)")
    table = {r["run"]: r for r in exp.table()}
    asp, bsp = (table[f"{c}, straggler"]["time_to_target_s"] for c in ("asp", "bsp"))
    from labkit.lessons.async_ps_verdicts import race_verdict, rate_verdict

    race = ns["raced"]
    timed(asp is not None and (bsp is None or asp < bsp), f"ASP {asp} s, BSP {bsp} s", race)
    judged([race_verdict(exp), rate_verdict(exp)], race, label="race")
    assert all(table[n]["max_staleness"] == 0 for n in table if n.startswith("bsp"))
    for n in (n for n in table if n.startswith("ssp")):  # Ho et al.: the clock gap, if reported
        m = exp.runs[n].metrics
        assert m.get("max_clock_gap", m["max_staleness"]) <= exp.settings["bound"], n


def lesson_12(ns: dict[str, Any]) -> None:
    """Ray Train trains the same weights as labkit's launcher and its step costs about
    labkit's (a verdict; a miss drawn beside its replay); the restarted actor lost
    exactly the updates since its last checkpoint; the resumed run equals the run that
    never failed. The actor server on the page ends with labkit's parameter server's exact
    weights; the driver serialized a by-value payload once per task, a put one once."""
    assert ns["ours"].params_sha256 == ns["via_ray"].params_sha256
    from labkit.lessons.ray_lesson import launchers_verdict, tasks_verdict

    # Ray Train's helper actors no longer step beside the ranks (settle_helpers, the watcher
    # off), but 10 steps of 3 ms are a 30 ms window, two runs apart: at load 1.2-1.6 pairs
    # read 1.14, 1.11, 1.03 and the lesson 0.82 (holds), 2.23-2.84 (contradicted), and
    # labkit's own run the slower 0.54-0.66 (2026-11-30, docs/benchmarks.md)
    launchers = launchers_verdict(ns["ours"], ns["via_ray"])
    judged([launchers], ns["launched"], label="launchers", may_miss_quiet=[launchers])
    judged([tasks_verdict(ns["elapsed"], len(ns["results"]))], ns["tasks_said"], label=None)
    mech, w = ns["mech"], ns["w"]
    assert mech.weights_sha256(w) == ns["labkits"].params_sha256, "the page's actor != labkit's ps"
    store = ns["store"]
    assert (store["serialized_by_value"], store["serialized_by_reference"]) == (store["tasks"], 1)
    r = ns["r"]
    assert r["updates_lost"] == r["actor_before"]["version"] % 3
    assert ns["resumed"].params_sha256 == ns["ours"].params_sha256
    assert ns["left"] == [], ns["left"]  # the closing cell stopped every process it started


def lesson_13(ns: dict[str, Any]) -> None:
    """The planner counts the fullest rank's model state of the 4-rank run within 10% of what
    the run kept and rank 0's tensor-parallel all-reduces exactly as the trace does; the
    model-state cell on the page equals the planner's for every shape; the lesson GPT's best
    layout computes under half its step at both scales; Meta's TP 8 x PP 16 ranks in the top 3
    for Llama 3 405B with MFU within 15% of the published 41%, and each one-axis change is
    slower or does not fit, bound by the term the markdown reads off its bar; seed 000's pure
    DP does not fit and options A and B do; the 320 GB model's best layout fits, its TP
    inside a node."""
    from labkit.lessons.mechanism import compare
    from labkit.lessons.plan_lesson import tp_collectives, tp_collectives_predicted
    from labkit.theory.plan import rank_of

    rows = ns["rows"]
    planner, measured = (sum(r[k] for r in rows) for k in ("planner_kB", "measured_kB"))
    assert abs(planner / measured - 1) < 0.10, rows
    assert tp_collectives(ns["mine"]) == tp_collectives_predicted(ns["own_layout"]()) > 0
    assert compare(ns["yours"], ns["labkits"], what="states", rtol=1e-9)
    for name, preds in ns["plans"].items():
        q = preds[0]
        compute = sum(t.value for t in q.time if t.name in ("compute", "recompute"))
        assert compute < 0.5 * q.step_s, (name, q.time)
    pub, alts = ns["LLAMA3_405B_16K"], ns["alts"]
    assert 1 <= rank_of(ns["preds"], dp=pub.dp, tp=pub.tp, pp=pub.pp) <= 3
    meta = alts["Meta's"]
    assert abs(meta.mfu / pub.mfu - 1) <= 0.15, meta.mfu
    for name, q in alts.items():
        assert name == "Meta's" or not q.fits or q.mfu < meta.mfu, (name, q.mfu, meta.mfu)
    binds = {name: q.binding for name, q in alts.items()}  # what the markdown reads off the bars
    assert binds["TP 16 (two nodes)"].startswith("TP across nodes"), binds
    assert binds["TP 4"].startswith("bubble") and binds["PP 8"].startswith("bubble"), binds
    assert binds["no pipeline"].startswith("DP reduction"), binds
    opts = list(ns["options"].values())
    assert not opts[0].fits and opts[1].fits and opts[2].fits, [q.memory_bytes for q in opts]
    best = ns["preds320"][0]
    assert best.fits and best.layout.tp <= 8, best.layout


def lesson_14(ns: dict[str, Any]) -> None:
    """Sequence parallelism halves the LayerNorms' bytes on tp2 with the predicted tensor
    traffic; the merge on 2 ranks matches labkit's; zig-zag balances the ring (9 blocks per
    rank), plain does not, both as counted on paper; the ring's trace shows every rank
    computing with block (r - t) mod cp while its send is already posted; the dp x cp x tp
    and dp x ep runs equal one process with every axis's bytes predicted; a tight capacity
    drops tokens and its ep bytes still follow the routing."""
    from labkit.lessons.mechanism import compare

    plain, sp = (ns[k].metrics for k in ("plain_tp", "with_sp"))
    for m in (plain, sp):
        assert m["ln_activation_bytes_per_rank"] == m["predicted_ln_activation_bytes_per_rank"]
        assert m["comm_bytes_per_axis"] == m["predicted_comm_bytes_per_axis"], m
        assert m["max_abs_diff_vs_reference"] < 1e-5
    assert plain["ln_activation_bytes_per_rank"][0] == 2 * sp["ln_activation_bytes_per_rank"][0]
    both = ns["both"]
    assert compare([b[0] for b in both], [b[1] for b in both], what="merge", atol=1e-12)
    blocks = ns["blocks"]
    for name in ("zigzag", "plain"):
        assert blocks[name]["measured"] == blocks[name]["predicted"], (name, blocks[name])
    assert {sum(b) for b in blocks["zigzag"]["measured"]} == {9}
    assert len({sum(b) for b in blocks["plain"]["measured"]}) == 4
    rows = ns["ring_steps"](ns["ring_trace"])
    assert len(rows) == 16, rows
    for r in rows:
        assert r["computes with"] == f"kv{(r['rank'] - r['ring step']) % 4}", r
        assert r["send posted first"] == ("yes" if r["ring step"] < 3 else "-"), r
    long = ns["long"].metrics
    assert long["max_abs_diff_vs_reference"] < 1e-5
    assert long["comm_bytes_per_axis"] == long["predicted_comm_bytes_per_axis"]
    moe, tight = ns["moe"].metrics, ns["tight"].metrics
    assert moe["dropped_assignments"] == 0 and moe["max_abs_diff_vs_reference"] < 1e-5
    assert tight["dropped_assignments"] > 0
    for m in (moe, tight):
        assert m["comm_bytes_per_axis"]["ep"] == m["predicted_comm_bytes_per_axis"]["ep"] > 0
