"""Problem set 4, instructor side: the rules that grade reasoning, and the hidden variants.

Q1 (seed 003 Level I): which approach, and the one deciding fact. The rule: count the
memory honestly (16 B/param for mixed-precision Adam, ``labkit.theory.bytes_per_param``;
a measured footprint when the scenario gives one). Does not fit one GPU -> sharded data
parallelism or model parallelism (both defensible; the fact is fits-or-not). Fits and
slower than acceptable -> data parallelism (the fact is slow-or-not). Fits and fast
enough -> no distribution (the fact is slow-or-not).

Q2 (seed 000's mini challenge): the configuration is run through the lab's own models:
memory (``theory.fits``), step time (compute scaled by batch, accumulation and precision;
``theory.ring_allreduce_time`` over the scenario's link, x1.5 for ZeRO-3; with overlap the
all-reduce hides behind the last micro-batch's backward, minus the last bucket), the LR
rule (``theory.scaled_lr``) with warmup, precision; and for the seed's own scenario a real
run on this machine (``labkit.run("scaling")`` with the student's batch and LR ratios).

Q3 (seed 003 Level III): ``analyze`` names the bottleneck from a timeline's numbers; the
grade compares the student's diagnosis with it on the public and the hidden traces.

Q1's scenarios and Q2's challenges are drawn from a generator seeded with ``SECRET`` and
the student's id (autograding passes it as ``student_id``), and a hidden case's feedback
names its inputs and the rule, never its answer (no deciding fact, no scaled LR). Q3's
hidden traces are recordings, the same for everyone; their feedback never names the
right kind, rank or lever.
"""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path
from typing import Any

from labkit import theory
from labkit.events import Op
from labkit.grading import calls
from labkit.grading.parts import Question
from labkit.grading.reasoning import (
    CHALLENGE_FORBID,
    PARALLELISM,
    SEED_CHALLENGE,
    SEED_SCENARIOS,
    read_config,
    read_diagnosis,
    read_strategy,
)
from labkit.analysis.timeline import Timeline

HERE = Path(__file__).resolve().parent

# --- Q1 --------------------------------------------------------------------------------------

SECRET = "ps4-hidden-c4a7"


def _rng(student: str, what: str) -> random.Random:
    return random.Random(f"{SECRET}:{what}:{student}")


def hidden_scenarios(student: str) -> dict[str, dict[str, Any]]:
    """Five scenarios drawn for ``student``: too big for a GPU (twice), fits but too slow
    (twice: a parameter count or a measured footprint), fits and fast enough."""
    rng = _rng(student, "scenarios")
    out = {}
    for i, kind in enumerate(("big", "big", "slow", "slow", "fast")):
        card = rng.choice((16, 24, 40, 80))
        ok = rng.choice((12, 24, 48, 72))
        s: dict[str, Any] = {"model": f"hidden model {i + 1}", "params": None,
                             "memory_gb": None, "gpu_gb": card, "acceptable_hours": ok}
        if kind == "big":
            s["params"] = round(card * 1e9 / 16 * rng.uniform(1.5, 30), -8)
            s["hours_on_one_gpu"] = rng.choice((None, round(ok * rng.uniform(0.5, 10))))
        else:
            if i == 2:
                s["params"] = round(card * 1e9 / 16 * rng.uniform(0.05, 0.7), -6)
            else:
                s["memory_gb"] = round(card * rng.uniform(0.1, 0.7), 1)
            s["hours_on_one_gpu"] = round(ok * (rng.uniform(1.5, 10) if kind == "slow"
                                                else rng.uniform(0.1, 0.7)), 1)
        out[f"hidden scenario {i + 1}"] = s
    return out


def memory_gb(s: dict[str, Any]) -> float:
    if s.get("memory_gb") is not None:
        return float(s["memory_gb"])
    return float(s["params"]) * theory.bytes_per_param("mixed", "adam")["total"] / 1e9


def defensible(s: dict[str, Any]) -> tuple[set[str], str, str]:
    """(approaches that are defensible, the deciding fact, why) for one scenario."""
    need, card = memory_gb(s), float(s["gpu_gb"])
    hours, ok = s.get("hours_on_one_gpu"), float(s["acceptable_hours"])
    if need > card:
        return {"sharded", "model"}, "fits", (
            f"training needs about {need:g} GB (16 B per parameter) but a GPU has {card:g} GB: "
            "one replica does not fit, so plain data parallelism or one GPU cannot work; "
            "shard it (ZeRO / FSDP) or split the model")
    if hours is not None and hours > ok:
        return {"data"}, "slow", (
            f"it fits ({need:g} of {card:g} GB) but takes {hours:g} h against {ok:g} h "
            "acceptable: replicate it and split the batch (data parallelism); sharding or "
            "model parallelism only add communication for memory you do not need")
    return {"none"}, "slow", (
        f"it fits ({need:g} of {card:g} GB) and {hours:g} h is within {ok:g} h: one GPU is "
        "enough; distributing would add communication and complexity for nothing")


def check_strategies(q: Question, fn: Any, student: str = "") -> None:
    """Every seed scenario and every hidden variant: a defensible approach and its fact."""
    cases = {**{f"({k}) {v['model']}": v for k, v in SEED_SCENARIOS.items()},
             **hidden_scenarios(student)}
    for label, scenario in cases.items():
        part = label if label.startswith("(") else "other scenarios (hidden)"
        answer = calls.answer(q, part, fn, (dict(scenario),), forbid=CHALLENGE_FORBID,
                              reader=read_strategy, where=label)
        if answer is None:
            continue
        approaches, fact, why = defensible(scenario)
        if not label.startswith("("):  # a hidden case: its inputs and the rule, not its answer
            why = (f"{_facts(scenario)}; count the memory (16 B per parameter for "
                   "mixed-precision Adam, or the measured footprint) against one GPU, then "
                   "the hours against what is acceptable")
        if answer["approach"] not in approaches:
            q.record(part, False, f"{label}: '{answer['approach']}' is not defensible: {why}.")
        else:
            q.record(part, answer["fact"] == fact,
                     f"{label}: '{answer['approach']}' is defensible, but the fact you named "
                     f"does not decide it: {why}." if not label.startswith("(") else
                     f"{label}: '{answer['approach']}' is right, but the fact that decides it "
                     f"is {fact}-or-not: {why}.")


def _facts(s: dict[str, Any]) -> str:
    size = f"{s['params']:g} parameters" if s.get("params") else f"{s['memory_gb']:g} GB"
    hours = s.get("hours_on_one_gpu")
    return (f"{size}, a {s['gpu_gb']:g} GB GPU, "
            + (f"{hours:g} h on one GPU" if hours is not None else "no one-GPU time")
            + f", {s['acceptable_hours']:g} h acceptable")


# --- Q2 --------------------------------------------------------------------------------------

LINKS = ("pcie4", "nvlink3", "ethernet_25g")


def hidden_challenges(student: str) -> dict[str, dict[str, Any]]:
    """Three challenges drawn for ``student`` (in the first, plain DDP does not fit); each
    target is 60% of what bf16, overlap and accumulation (at most 64x the base batch) reach
    by the lab's model, so it can be met."""
    rng = _rng(student, "challenges")
    out: dict[str, dict[str, Any]] = {}
    while len(out) < 3:
        gpus = rng.choice((2, 4, 8))
        ch = {"gpus": gpus, "gpus_per_node": rng.choice((gpus, max(2, gpus // 2))),
              "gpu_gb": rng.choice((24, 40, 80)), "link": rng.choice(LINKS),
              "params": round(rng.uniform(0.1, 8) * 1e9, -7),
              "step_s_one_gpu": round(rng.uniform(0.2, 1.5), 2),
              "base_batch": rng.choice((8, 16, 32)), "base_lr": rng.choice((1e-4, 2e-4, 3e-4))}
        stage = next((st for st in range(4) if theory.fits(
            ch["params"], gpus=gpus, gpu_gb=ch["gpu_gb"], stage=st).fits), None)
        if stage is None or stage == 0 and not out:  # the first needs ZeRO: DDP does not fit
            continue
        best = max(predicted_speedup(ch, {
            "precision": "bf16", "per_gpu_batch": ch["base_batch"], "accumulation": acc,
            "parallelism": ("ddp", "zero1", "zero2", "zero3")[stage], "overlap": True})
            for acc in range(1, 64 // gpus + 1))
        if best >= 2:
            out[f"hidden challenge {len(out) + 1}: {gpus} GPUs"] = {
                **ch, "target_speedup": math.floor(6 * best) / 10}
    return out


def predicted_speedup(ch: dict[str, Any], cfg: dict[str, Any]) -> float:
    """Throughput over one fp32 GPU at the base batch, by the lab's models."""
    link = theory.get_link(ch["link"])
    half = cfg["precision"] in ("bf16", "fp16")
    micro = ch["step_s_one_gpu"] * cfg["per_gpu_batch"] / ch["base_batch"] * (0.5 if half else 1)
    compute = micro * cfg["accumulation"]
    grad_bytes = ch["params"] * (2 if half else 4)
    comm = theory.ring_allreduce_time(grad_bytes, ch["gpus"], link.alpha_s, link.bandwidth_Bps)
    if cfg["parallelism"] in ("zero3", "fsdp"):
        comm *= theory.zero_comm_volume(ch["params"], 3)["relative_to_ddp"]
    hidden = 0.9 * min(comm, 2 / 3 * micro) if cfg["overlap"] else 0.0
    step = compute + comm - hidden
    return (ch["gpus"] * cfg["per_gpu_batch"] * cfg["accumulation"] / step) / (
        ch["base_batch"] / ch["step_s_one_gpu"])


def lr_problem(ch: dict[str, Any], cfg: dict[str, Any], shown: bool = True) -> str | None:
    """What is wrong with the LR; ``shown``: the rules' values may be named (not for a
    hidden case, whose right LR would then be in the feedback)."""
    new = cfg["per_gpu_batch"] * cfg["accumulation"] * ch["gpus"]
    rules = {r: theory.scaled_lr(ch["base_lr"], ch["base_batch"], new, r) for r in ("linear", "sqrt")}
    if not any(math.isclose(cfg["lr"], v, rel_tol=0.05) for v in rules.values()):
        said = (f"the linear rule gives lr {rules['linear']:.3g}, the square-root rule "
                f"{rules['sqrt']:.3g}" if shown else "scale the base lr by k (linear rule) "
                "or by sqrt(k) (square-root rule)")
        return (f"global batch {new} is {new / ch['base_batch']:g}x the base {ch['base_batch']}: "
                f"{said}; you chose {cfg['lr']:.3g}")
    if cfg["lr"] > ch["base_lr"] * 1.01 and cfg["warmup_steps"] < 1:
        return "the LR grows with the batch, so warm it up (Goyal et al.: a few hundred steps)"
    if new > 64 * ch["base_batch"]:
        return f"global batch {new} is over 64x the base: linear scaling stops holding there"
    return None


def lab_runs(ch: dict[str, Any], cfgs: dict[str, dict[str, Any]]) -> dict[str, tuple[bool, str]]:
    """The lab's MLP trained with each configuration's batch and LR ratios, 2 real ranks.

    The lab's base: batch 16, LR 0.2 (lesson 02); a configuration at k x its base batch and
    m x its base LR trains at 16k and 0.2m on the same sample budget (2560), with the
    lesson's 3-step warmup when it asked for one. Stable = no divergence and the final
    loss at most 85% of the first. All configurations share one launch.
    """
    from labkit.config import RunConfig
    from labkit.lessons.scaling import LESSON_MODEL, record_variants

    plans, ratios = {}, {}
    for name, cfg in cfgs.items():
        k = cfg["per_gpu_batch"] * cfg["accumulation"] * ch["gpus"] / ch["base_batch"]
        k = min(32, max(1, round(k)))
        m = cfg["lr"] / ch["base_lr"]
        ratios[name] = (k, m)
        plans[name] = RunConfig(
            strategy="scaling", world_size=2, batch_size=max(1, 16 * k // 2), lr=0.2 * m,
            steps=max(5, 2560 // (16 * k)), model=LESSON_MODEL, seed=0, timeout_s=90,
            progress=False, backend="gloo",
            options={"warmup_steps": 3 if cfg["warmup_steps"] > 0 else 0})
    out = {}
    for name, run in record_variants(plans).items():
        k, m = ratios[name]
        ok = not run.diverged and run.final_loss() <= 0.85 * run.losses[0]
        out[name] = (ok, f"the lab's model at {k}x the batch and lr x{m:.3g}: loss "
                         f"{run.losses[0]:.2f} -> {run.final_loss():.2f}"
                         f"{' (diverged)' if run.diverged else ''}")
    return out


def lab_run_stable(ch: dict[str, Any], cfg: dict[str, Any]) -> tuple[bool, str]:
    return lab_runs(ch, {"student": cfg})["student"]


def check_challenge(q: Question, fn: Any, student: str = "", real_run: bool = True) -> None:
    cases = {"seed 000: 4 GPUs, 2x": SEED_CHALLENGE, **hidden_challenges(student)}
    for label, ch in cases.items():
        cfg = calls.answer(q, "fits in memory", fn, (dict(ch),), forbid=CHALLENGE_FORBID,
                           reader=read_config, where=label)
        if cfg is None:
            continue
        stage = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}.get(cfg["parallelism"])
        if stage is None:
            q.record("fits in memory", False, f"{label}: {cfg['parallelism']} splits the model; "
                     "for these sizes data parallelism (with ZeRO if memory is short) is simpler "
                     "and has no bubble or per-layer traffic")
        else:
            fit = theory.fits(ch["params"], gpus=ch["gpus"], gpu_gb=ch["gpu_gb"], stage=stage)
            q.record("fits in memory", fit.fits, f"{label}: {fit.explanation}")
        speed = predicted_speedup(ch, cfg)
        q.record("at least the target speedup (lab model)", speed >= ch["target_speedup"],
                 f"{label}: the lab's model predicts {speed:.3f}x, the target is "
                 f"{ch['target_speedup']:g}x. Levers: bf16 halves compute and gradient bytes, "
                 "overlap hides the all-reduce behind backward, accumulation sends one "
                 "all-reduce per several micro-batches.")
        problem = lr_problem(ch, cfg, shown=label.startswith("seed"))
        q.record("LR follows the global batch, with warmup", problem is None, f"{label}: {problem}")
        unsafe = cfg["precision"] == "fp16" and not cfg["loss_scaling"]
        q.record("precision is safe", not unsafe, f"{label}: fp16 needs loss scaling (its "
                 "range is small: small gradients underflow to 0); bf16 does not")
        if real_run and label.startswith("seed"):
            ok, why = lab_run_stable(ch, cfg)
            q.record("stable in a real run on this machine", ok, f"{label}: {why}")


# --- Q3 --------------------------------------------------------------------------------------

LEVERS = {"slow_stage": {"rebalance_stages"},
          "slow_link": {"fix_the_link", "compress_gradients"},
          "exposed_allreduce": {"overlap_communication", "compress_gradients", "bigger_batch"}}
PUBLIC_TRACES = {"example_1": ("slow_stage", 2, 4, 11), "example_2": ("slow_link", 1, 3, 12),
                 "example_3": ("exposed_allreduce", None, 2, 13)}
HIDDEN_TRACES = {"hidden_1": ("slow_stage", 1, 4, 21), "hidden_2": ("slow_stage", 3, 4, 22),
                 "hidden_3": ("slow_link", 0, 3, 23), "hidden_4": ("slow_link", 2, 4, 24),
                 "hidden_5": ("exposed_allreduce", None, 2, 25)}


def _steady(timeline: Timeline) -> Timeline:
    steps = timeline.steps()
    return timeline.window(steps[1:]) if len(steps) > 1 else timeline


def analyze(timeline: Timeline) -> tuple[str, int | None]:
    """The bottleneck, from the timeline's own numbers (first step skipped: warm-up).

    1. A pipeline (forwards carry microbatch numbers): the stage whose forward+backward
       time per microbatch is at least 1.5x the median stage's is the slow stage.
    2. Point-to-point sends: the rank whose sends move bytes at under 40% of the median
       rank's rate has the slow outgoing link.
    3. Otherwise: communication not overlapped with compute over 25% of the step is an
       exposed all-reduce.
    """
    tl = _steady(timeline)
    ranks = range(tl.world_size)
    work = [e for e in tl.select(op=Op.FORWARD) if e.microbatch is not None]
    if work:
        per = [statistics.mean(e.dur_ns for e in tl.select(rank=r)
                               if e.op in (Op.FORWARD, Op.BACKWARD)) for r in ranks]
        slow = max(ranks, key=lambda r: per[r])
        if per[slow] >= 1.5 * statistics.median(per):
            return "slow_stage", slow
    sends = {r: [e for e in tl.select(rank=r, op=Op.SEND)] for r in ranks}
    if all(sends.values()):
        rate = [sum(e.bytes or 0 for e in sends[r]) / max(1, sum(e.dur_ns for e in sends[r]))
                for r in ranks]
        slow = min(ranks, key=lambda r: rate[r])
        if rate[slow] < 0.4 * statistics.median(rate):
            return "slow_link", slow
    exposed = [(tl.comm_ns(r) - tl.overlap_ns(r)) / max(1, tl.span_ns(r)) for r in ranks]
    if statistics.median(exposed) > 0.25:
        return "exposed_allreduce", None
    return "none", None


def load_trace(name: str) -> Timeline:
    folder = HERE.parent / "ps4_reasoning" / "traces" if name.startswith("example") \
        else HERE / "ps4_traces"
    return Timeline.load(folder / f"{name}.json")


def check_diagnoses(q: Question, fn: Any) -> None:
    for name in [*PUBLIC_TRACES, *HIDDEN_TRACES]:
        timeline = load_trace(name)
        kind, rank = analyze(timeline)
        where = "public example" if name.startswith("example") else "hidden trace"
        got = calls.answer(q, "the kind of bottleneck", fn, (timeline,),
                           forbid=CHALLENGE_FORBID, reader=read_diagnosis,
                           where=f"{name} ({where})")
        if got is None:
            continue
        q.record("the kind of bottleneck", got["kind"] == kind,
                 f"{name} ({where}): you said {got['kind']}; the timeline says otherwise. Compare "
                 "per-rank compute per microbatch (a slow stage), bytes per second of each "
                 "rank's sends (a slow link) and communication outside compute (exposed).")
        if rank is not None and got["kind"] == kind:
            q.record("the rank or stage", got["rank"] == rank,
                     f"{name} ({where}): {kind} at rank {got['rank']}? Look again at which rank's "
                     "numbers stand out.")
        if got["kind"] == kind:
            q.record("a lever that fixes it", got["lever"] in LEVERS[kind],
                     f"{name} ({where}): '{got['lever']}' does not remove a {kind}.")


__all__ = ["PARALLELISM", "analyze", "check_challenge", "check_diagnoses", "check_strategies"]
