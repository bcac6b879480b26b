"""What each lesson's own run must show, checked in the lesson's kernel after its last cell.

``tests/notebooks/test_notebooks.py`` executes a lesson, then runs ``check(NAME, globals())``
in the same kernel: the checks read the very objects the cells printed and plotted, so they
pin what the student saw. They assert the *phenomenon* each lesson teaches, with a margin
(a ratio, an order, a split), never a time. A check fails with the measured numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def lesson_11(ns: dict[str, Any]) -> None:
    """With a straggler, ASP handles at least 1.5x BSP's gradients per second while every
    worker computes (predicted 2.5), reaches the target loss first, and the printed race says
    so; BSP stays synchronous SGD and SSP within its bound."""
    ps, exp = ns["ps"], ns["exp"]
    rows = {r["quantity"]: r for r in ps.straggler_predictions(exp)}
    ratio = rows["ASP / BSP gradients per second"]["measured"]
    assert ratio >= 1.5, f"ASP / BSP gradients per second {ratio:.2f} < 1.5 (predicted 2.5)"
    table = {r["run"]: r for r in exp.table()}
    asp, bsp = (table[f"{c}, straggler"]["time_to_target_s"] for c in ("asp", "bsp"))
    assert asp is not None and (bsp is None or asp < bsp), f"ASP {asp} s, BSP {bsp} s"
    assert "the rule holds here" in ps.race_text(exp), ps.race_text(exp)
    assert all(table[n]["max_staleness"] == 0 for n in table if n.startswith("bsp"))
    for n in (n for n in table if n.startswith("ssp")):  # Ho et al.: the clock gap, if reported
        m = exp.runs[n].metrics
        assert m.get("max_clock_gap", m["max_staleness"]) <= exp.settings["bound"], n


def lesson_01(ns: dict[str, Any]) -> None:
    """The ring sends 2(n-1)/n x S per rank (within one chunk's rounding); DDP equals one
    process; buckets hide communication that the naive variant leaves exposed; without a
    DistributedSampler every sample is loaded twice, with one none; SyncBatchNorm equals
    one process where BatchNorm does not."""
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


def lesson_02(ns: dict[str, Any]) -> None:
    """At equal samples, unscaled N-rank training ends above linear scaling; 16x the LR
    diverges and clipping keeps it finite; accumulation equals the big batch."""
    rows = {r["run"]: r for r in ns["exp"].table()}
    unscaled = next(r for k, r in rows.items() if "unscaled" in k)
    linear = next(r for k, r in rows.items() if "linear scaling" in k)
    assert unscaled["final_loss"] > linear["final_loss"] + 0.1, (unscaled, linear)
    assert next(r for k, r in rows.items() if k.endswith("too large"))["diverged"]
    assert not next(r for k, r in rows.items() if "clipping" in k)["diverged"]


def lesson_07(ns: dict[str, Any]) -> None:
    """The resumed run ends bit-identical to the uninterrupted one; so does torchrun's
    elastic restart; a 4-rank checkpoint loads on 2 ranks exactly."""
    assert ns["resumed"].params_sha256 == ns["reference"].params_sha256
    assert ns["rep"]["params_sha256"] == ns["ref10"].params_sha256
    assert ns["r"]["max_abs_diff"] == 0.0


def lesson_09(ns: dict[str, Any]) -> None:
    """Every layout equals one process and puts the predicted bytes on each axis; balancing
    by measured cost moves blocks off the heavy last stage and makes the slowest stage at
    least 10% faster."""
    for name, r in ns["runs"].items():
        assert r.metrics["max_abs_diff_vs_reference"] < 1e-5, name
        assert all(abs(v - 1) < 1e-6 for v in r.metrics["comm_ratio_per_axis"].values()), name
    count, cost = (ns["bal"][k].metrics for k in ("by block count", "by measured cost"))
    last = lambda m: m["stage_bounds"][-1] - m["stage_bounds"][-2]
    assert last(cost) < last(count), (count["stage_bounds"], cost["stage_bounds"])
    from labkit.lessons.parallel3d import stage_ms

    before, after = (max(stage_ms(ns["bal"][k])) for k in ("by block count", "by measured cost"))
    assert after < 0.9 * before, f"slowest stage {before:.1f} -> {after:.1f} ms"


def lesson_10(ns: dict[str, Any]) -> None:
    """Across the link TP is never predicted below TP measured inside one node (nor the
    pipeline below its own), and the link slows TP more than the pipeline; every link
    delivers its shaped rate within 10%."""
    rows = ns["place"]["rows"]
    inside = {r["strategy"]: r for r in rows if r["where"].startswith("inside")}
    across = {r["strategy"]: r for r in rows if not r["where"].startswith("inside")}
    for name in ("tp", "pipeline"):
        assert across[name]["predicted_step_s"] >= inside[name]["step_s"], name
    if across["tp"]["slowdown"] is not None:  # an emulated cluster ran here
        tp, pp = across["tp"]["slowdown"], across["pipeline"]["slowdown"]
        assert tp > 1.2 * pp, f"the link slowed TP {tp:.2f}x, the pipeline {pp:.2f}x"
        assert all(abs(r["rate_error"]) < 0.1 for r in ns["links"]), ns["links"]


def lesson_12(ns: dict[str, Any]) -> None:
    """Ray Train trains the same weights as labkit's launcher; the restarted actor lost
    exactly the updates since its last checkpoint; the resumed run equals the run that
    never failed."""
    assert ns["ours"].params_sha256 == ns["via_ray"].params_sha256
    r = ns["r"]
    assert r["updates_lost"] == r["actor_before"]["version"] % 3
    assert ns["resumed"].params_sha256 == ns["ours"].params_sha256
    assert ns["left"] == [], ns["left"]  # the closing cell stopped every process it started


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "01_data_parallelism": lesson_01, "02_batch_size_and_lr": lesson_02,
    "07_fault_tolerance": lesson_07, "09_3d_parallelism": lesson_09,
    "10_multi_node": lesson_10, "11_async_training": lesson_11, "12_ray": lesson_12,
}


def check(stem: str, ns: dict[str, Any]) -> str:
    """Run the lesson's check, if it has one; returns what was checked (for the output)."""
    fn = CHECKS.get(stem)
    if fn is None:
        return f"{stem}: no claims to check"
    fn(ns)
    return f"{stem}: {fn.__doc__.split(chr(10))[0] if fn.__doc__ else 'checked'}"
