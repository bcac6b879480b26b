"""Problem set 7 (planning at scale): the scenario students see, the checks the planner grades.

Lesson 13's graded exercise. A scenario is plain data (a decoder's shape, a GPU's datasheet,
the GPU count, the global batch); the student writes

* ``state_gb(scenario, layout)``: the fullest GPU's model state (16 B per parameter,
  bf16 weights and gradients, Adam's fp32 copy and moments, ZeRO on the data axis);
* ``mfu(scenario, tokens_per_s_per_gpu)``: model FLOPs utilisation of a measured rate;
* ``plan_layout(scenario)``: a layout (dp, tp, pp, microbatch, ZeRO stage, recomputation)
  and their own prediction of its memory per GPU and MFU.

The key is ``labkit.theory.plan`` itself: model state and MFU as its terms count them, the
layout rated by ``predict`` (fits, tokens/s within ``THROUGHPUT_SHARE`` of the planner's best
layout with ZeRO 0-2: ZeRO-3's per-microbatch gathers need a network model the notebook does
not give) and the student's memory and MFU within ``MEMORY_REL`` and ``MFU_REL`` of the
planner's for that same layout. The tolerances admit the simplifications the notebook states
(DP traffic and p2p left out of the MFU estimate, the busiest stage's logits); the solution,
which makes exactly those, is 1.00-1.15x the planner's MFU, equal on memory, and reaches
87-100 % of its best throughput on 60 hidden scenarios of 20 students
(``bench/bench_plan_grading.py``, docs/benchmarks.md; ``tests/unit/test_grading_at_scale.py``
grades two students' in full).

Only what a student may see lives here; the hidden per-student scenarios are drawn on the
instructor's side (``solutions/_grading/ps7_planning_at_scale.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from labkit.grading import calls
from labkit.grading.checks import NotANumber, as_number, close
from labkit.grading.parts import Question

MEMORY_REL = 0.05
"""The memory rules are stated exactly; 5 % absorbs rounding and the communication buffers."""
MFU_REL = 0.20
"""The notebook's step estimate leaves out p2p, DP traffic and the last stage's logits."""
THROUGHPUT_SHARE = 0.75
"""A layout earns the throughput part at 75 % of the planner's best tokens/s per GPU."""
STATE_REL = 1e-3
"""Model state and MFU are exact arithmetic on the scenario's numbers."""
STATE_FORBID = ("labkit.theory", "labkit.lessons", "labkit.grading", "labkit.widgets")
"""Q1 and Q2 are the arithmetic itself: the planner's terms would do it."""
PLAN_FORBID = ("labkit.theory.plan", "labkit.lessons", "labkit.grading", "labkit.widgets")
"""Q3 may use the lab's formulas (``labkit.theory``: zero_memory, bubble_fraction, ring
times) but not the planner (``labkit.theory.plan*``) that grades it."""
RECOMPUTE = ("none", "selective", "full")
LAYOUT_KEYS = ("dp", "tp", "pp", "micro_batch", "zero", "recompute")

LLAMA3_70B = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672,
              "swiglu": True, "vocab": 128256, "seq": 8192, "bias": False,
              "learned_positions": False}
"""Llama 3 70B (Llama Team 2024, Table 3), as a scenario's model."""
H100 = {"name": "h100-sxm", "bf16_tflops": 989.0, "memory_gb": 80.0, "mamf": 0.801,
        "nvlink_GBps": 450.0}
"""The H100 SXM datasheet (dense bf16) and its measured best-GEMM share (lesson 13)."""
SEED_SCENARIO: dict[str, Any] = {"model": LLAMA3_70B, "gpu": H100, "gpus": 512, "per_node": 8,
                                 "global_batch_tokens": 512 * 8192}
"""The visible scenario: Llama 3 70B on 64 nodes of 8 H100s, 4M-token batches."""
SEED_STATE_LAYOUTS = [{"dp": 64, "tp": 8, "pp": 1, "zero": 0},
                      {"dp": 2, "tp": 8, "pp": 32, "zero": 0},
                      {"dp": 8, "tp": 8, "pp": 8, "zero": 1},
                      {"dp": 512, "tp": 1, "pp": 1, "zero": 3}]
SEED_RATES = [1000.0, 400.0]
"""Tokens per second per GPU for the visible MFU cases."""


def objects(scenario: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """The planner's model, cluster and training of a scenario (16 B per parameter)."""
    from labkit.theory.plan_models import Decoder, Training, cluster

    return (Decoder("scenario", **scenario["model"]),
            cluster(scenario["gpu"]["name"], scenario["gpus"], scenario["per_node"]),
            Training(global_batch_tokens=scenario["global_batch_tokens"], fp32_grads=False))


def planner_layout(scenario: Mapping[str, Any], lay: Mapping[str, Any]) -> Any:
    """The planner's ``Layout`` of a student's layout (1F1B; microbatches from the batch)."""
    from labkit.theory.plan_terms import Layout

    sequences = int(scenario["global_batch_tokens"] // scenario["model"]["seq"])
    m = sequences // lay["dp"] // lay["micro_batch"]
    return Layout(lay["dp"], lay["tp"], lay["pp"], lay["micro_batch"], m, zero=lay["zero"],
                  recompute=lay["recompute"])


def key_state_gb(scenario: Mapping[str, Any], lay: Mapping[str, int]) -> float:
    """Model state of the fullest GPU, GB: the planner's params + grads + optimizer."""
    from labkit.theory.plan_terms import Layout, memory_terms

    model, _, training = objects(scenario)
    terms = memory_terms(model, training, Layout(lay["dp"], lay["tp"], lay["pp"], 1, 1,
                                                 zero=lay["zero"]))
    return sum(t.value for t in terms if t.name in ("params", "grads", "optimizer")) / 1e9


def key_mfu(scenario: Mapping[str, Any], tokens_per_s_per_gpu: float) -> float:
    """MFU of a rate: ``(6 N + 12 L s h)`` FLOPs per token over the bf16 peak."""
    from labkit.theory.compute import training_flops

    model, net, _ = objects(scenario)
    per_token = training_flops(int(model.matmul_params), 1, seq=model.seq,
                               attention_layers=model.layers, hidden=model.hidden) / model.seq
    return per_token * tokens_per_s_per_gpu / net.gpu.bf16_flops


def _number(value: Any) -> float | str:
    try:
        return as_number(value)
    except NotANumber as exc:
        return f"{exc}. Return a plain int or float"


def _exact(q: Question, label: str, fn: Callable[..., Any], args: tuple[Any, ...],
           where: str, hint: str, want: Callable[[], float], reveal: bool) -> None:
    """One case of an arithmetic question: the student's number against the planner's."""
    got = calls.answer(q, label, fn, args, forbid=STATE_FORBID, reader=_number, where=where,
                       hint=hint)
    if got is not None:
        key = want()
        shown = f", expected {key:.4g}" if reveal else ""
        q.record(label, close(got, key, STATE_REL), f"{where}: got {got:.4g}{shown}. Try: {hint}")


def check_state(q: Question, fn: Callable[..., Any],
                cases: Iterable[tuple[Mapping[str, Any], Mapping[str, int]]],
                reveal: bool = False) -> None:
    """Q1 on (scenario, layout) cases, each in its part (pipeline / tensor / ZeRO)."""
    for scenario, lay in cases:
        label = ("ZeRO on the data axis" if lay["zero"] else
                 "uneven stages" if scenario["model"]["layers"] % lay["pp"] else
                 "pipeline and tensor split")
        _exact(q, label, fn, (dict(scenario), dict(lay)),
               f"state_gb(scenario with {scenario['model']['layers']} layers, {dict(lay)})",
               "the fullest stage holds ceil(layers / pp) layers plus the embedding (and the "
               "head when pp is 1); tp splits it all; ZeRO-z divides by dp",
               lambda: key_state_gb(scenario, lay), reveal)


def check_mfu(q: Question, fn: Callable[..., Any],
              cases: Iterable[tuple[Mapping[str, Any], float]], reveal: bool = False) -> None:
    """Q2 on (scenario, tokens/s per GPU) cases, parted by the model's shape."""
    for scenario, rate in cases:
        m = scenario["model"]
        label = ("grouped-query attention, SwiGLU" if m["swiglu"] or m["kv_heads"] != m["heads"]
                 else "multi-head attention, 4h FFN")
        _exact(q, label, fn, (dict(scenario), rate),
               f"mfu(scenario with hidden {m['hidden']}, {rate:g})",
               "count K and V at kv_heads / heads of Q's size, three FFN matrices with "
               "SwiGLU, and the output projection V h", lambda: key_mfu(scenario, rate),
               reveal)


def read_plan(value: Any) -> dict[str, Any] | str:
    """The answer of Q3 as a layout plus two numbers, or what is wrong with it."""
    if not isinstance(value, dict):
        return f"return a dict with {', '.join(LAYOUT_KEYS)}, memory_gb and mfu"
    missing = [k for k in (*LAYOUT_KEYS, "memory_gb", "mfu") if k not in value]
    if missing:
        return f"the answer lacks {', '.join(missing)}"
    for k in LAYOUT_KEYS[:5]:
        if type(value[k]) is not int or value[k] < 0:
            return f"'{k}' must be a non-negative int, not {value[k]!r}"
    if value["recompute"] not in RECOMPUTE:
        return f"'recompute' must be one of {RECOMPUTE}, not {value['recompute']!r}"
    for k in ("memory_gb", "mfu"):
        if isinstance(_number(value[k]), str):
            return f"'{k}' must be a number, not {value[k]!r}"
    return dict(value)


def plan_problems(scenario: Mapping[str, Any], lay: Mapping[str, Any]) -> list[str]:
    """Why a layout cannot run the scenario at all (the rules the notebook states)."""
    m, gpus = scenario["model"], scenario["gpus"]
    sequences = scenario["global_batch_tokens"] // m["seq"]
    out = []
    if min(lay["dp"], lay["tp"], lay["pp"], lay["micro_batch"]) < 1 or lay["zero"] > 3:
        return [f"dp, tp, pp and micro_batch must be >= 1 and zero 0..3, not {dict(lay)}"]
    if lay["dp"] * lay["tp"] * lay["pp"] != gpus:
        out.append(f"dp x tp x pp = {lay['dp'] * lay['tp'] * lay['pp']}, not {gpus} GPUs")
    if scenario["per_node"] % lay["tp"] or m["heads"] % lay["tp"]:
        out.append(f"tp ({lay['tp']}) must divide the node ({scenario['per_node']} GPUs) and "
                   f"the heads ({m['heads']})")
    if lay["pp"] > m["layers"]:
        out.append(f"pp ({lay['pp']}) must be at most {m['layers']} layers")
    if sequences % (lay["dp"] * lay["micro_batch"]):
        out.append(f"dp x micro_batch ({lay['dp'] * lay['micro_batch']}) must divide the "
                   f"{sequences} sequences of a step")
    if lay["zero"] == 3:
        out.append("zero must be 0-2 here: ZeRO-3 gathers every layer every microbatch, "
                   "which needs a network model this problem leaves out")
    return out


def best_without_zero3(model: Any, net: Any, training: Any) -> Any:
    """The planner's fastest fitting layout with ZeRO 0-2 (what Q3's choices can reach)."""
    from labkit.theory.plan import layouts, predict

    best = None
    for group in layouts(model, net, training):
        for lay in group:
            if lay.zero < 3:
                q = predict(model, net, training, lay)
                if q.fits and (best is None or q.tokens_per_s_per_gpu > best.tokens_per_s_per_gpu):
                    best = q
    return best


PLAN_PARTS = ["a layout the cluster can run", "fits in memory (the planner's count)",
              f"tokens/s within {1 - THROUGHPUT_SHARE:.0%} of the planner's best (ZeRO 0-2)",
              f"your memory per GPU within {MEMORY_REL:.0%} of the planner's",
              f"your MFU within {MFU_REL:.0%} of the planner's"]


def check_plan(q: Question, fn: Callable[..., Any], scenarios: Iterable[Mapping[str, Any]],
               reveal: bool = False) -> None:
    """Q3: the layout runs, fits and is fast; the student's numbers match the planner's."""
    from labkit.theory.plan import predict

    run, fits, fast, mem, util = PLAN_PARTS
    for n, scenario in enumerate(scenarios):
        where = f"plan_layout(scenario {n + 1})"
        got = calls.answer(q, run, fn, (dict(scenario),), forbid=PLAN_FORBID, reader=read_plan,
                           where=where)
        if got is None:
            continue
        problems = plan_problems(scenario, got)
        if not q.record(run, not problems, f"{where}: " + "; ".join(problems)):
            continue
        model, net, training = objects(scenario)
        mine = predict(model, net, training, planner_layout(scenario, got))
        best = best_without_zero3(model, net, training)
        shown = (lambda text: f" ({text})") if reveal else (lambda text: "")
        q.record(fits, mine.fits, f"{where}: the planner counts {mine.memory_bytes / 1e9:.1f} "
                 f"GB on the fullest GPU, over {mine.capacity_bytes / 1e9:.0f} GB")
        share = mine.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu
        q.record(fast, mine.fits and share >= THROUGHPUT_SHARE,
                 f"{where}: {share:.0%} of the best layout's tokens/s"
                 + shown(best.layout.label()))
        q.record(mem, close(float(got["memory_gb"]), mine.memory_bytes / 1e9, MEMORY_REL),
                 f"{where}: memory_gb {float(got['memory_gb']):.1f}"
                 + shown(f"the planner: {mine.memory_bytes / 1e9:.1f}"))
        q.record(util, close(float(got["mfu"]), mine.mfu, MFU_REL),
                 f"{where}: mfu {float(got['mfu']):.3f}" + shown(f"the planner: {mine.mfu:.3f}"))


def state_question(fn: Callable[..., Any], points: float = 3) -> Question:
    """Q1 on the visible layouts (expected values shown)."""
    q = Question("state_gb", points, ["pipeline and tensor split", "uneven stages",
                                      "ZeRO on the data axis"])
    check_state(q, fn, [(SEED_SCENARIO, lay) for lay in SEED_STATE_LAYOUTS], reveal=True)
    return q


def mfu_question(fn: Callable[..., Any], points: float = 2) -> Question:
    """Q2 on the visible rates (expected values shown)."""
    q = Question("mfu", points, ["grouped-query attention, SwiGLU",
                                 "multi-head attention, 4h FFN"])
    check_mfu(q, fn, [(SEED_SCENARIO, rate) for rate in SEED_RATES], reveal=True)
    return q


def plan_question(fn: Callable[..., Any], points: float = 5) -> Question:
    """Q3 on the visible scenario (the planner's numbers shown)."""
    q = Question("plan_layout", points, PLAN_PARTS)
    check_plan(q, fn, [SEED_SCENARIO], reveal=True)
    return q
