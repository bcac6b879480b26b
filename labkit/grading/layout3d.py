"""Problem set 5 (3D parallelism): the scenario students see, the answer formats, shape checks.

Lesson 09's graded exercise: lay a small GPT out on a ``dp x pp x tp`` grid so that no rank
holds more model state than a budget, then prove it by running it.

* ``state_bytes(scenario, layout) -> int``: the fullest rank's model state (parameters,
  gradients, optimizer state), worked out by hand from the model's shape;
* ``choose_layout(scenario) -> {"dp", "pp", "tp", "zero_stage"}``: a factorisation of the
  world size that keeps tensor parallelism inside a node, fits the budget and, of the
  layouts that fit, puts the fewest bytes on the wire per step.

This module holds only what a student may see. The hidden scenarios, the rules that grade
and the real run live on the instructor's side (``solutions/_grading/ps5_3d.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from labkit.grading import calls
from labkit.grading.parts import Question

# The lesson's GPT (``labkit.lessons.parallel3d.LESSON_GPT``: its vocabulary is the
# text task's 96 characters), 4 ranks on one node, SGD with momentum in fp32: 4 bytes of
# weights, 4 of gradients and 4 of momentum per parameter.
SEED_LAYOUT: dict[str, Any] = {
    "model": {"vocab": 96, "width": 64, "depth": 4, "heads": 4, "seq_len": 32},
    "world_size": 4, "ranks_per_node": 4, "budget_bytes": 1_000_000,
    "bytes_per_param": {"params": 4, "grads": 4, "optimizer": 4},
    "batch_size": 8, "microbatches": 2,
}
LAYOUT_KEYS = ("dp", "pp", "tp", "zero_stage")
STATE_FORBID = ("labkit.theory", "labkit.strategies", "labkit.grading")
"""Q1 asks for the arithmetic itself: ``labkit.theory.parallel_layout`` would do it."""
LAYOUT_FORBID = ("labkit.grading",)
"""Q2 is about the choice: the lesson's calculators (``labkit.theory``) are tools here."""


def read_layout(value: Any) -> dict[str, int] | str:
    """The layout as four ints (dp, pp, tp >= 1; zero_stage 0..3), or what is wrong."""
    if not isinstance(value, dict):
        return (f"return a dict like {{'dp': 2, 'pp': 2, 'tp': 1, 'zero_stage': 0}}, "
                f"not {type(value).__name__}")
    missing = [k for k in LAYOUT_KEYS if k not in value]
    if missing:
        return f"the layout lacks {', '.join(missing)}"
    out = {}
    for key in LAYOUT_KEYS:
        v = value[key]
        if type(v) is not int:
            return f"'{key}' must be an int, not {v!r}"
        out[key] = v
    if min(out["dp"], out["pp"], out["tp"]) < 1 or not 0 <= out["zero_stage"] <= 3:
        return f"dp, pp and tp must be >= 1 and zero_stage 0..3, not {out}"
    return out


def read_bytes(value: Any) -> float | str:
    """A byte count: a positive number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return f"return the number of bytes (a positive number), not {value!r}"
    return float(value)


def layout_problems(scenario: Mapping[str, Any], lay: Mapping[str, int]) -> list[str]:
    """Why ``lay`` cannot run ``scenario`` at all (the rules the lesson states)."""
    m, world = scenario["model"], scenario["world_size"]
    out = []
    if lay["dp"] * lay["pp"] * lay["tp"] != world:
        out.append(f"dp x pp x tp = {lay['dp'] * lay['pp'] * lay['tp']}, but the world has "
                   f"{world} ranks")
    if m["heads"] % lay["tp"] or m["width"] % lay["tp"]:
        out.append(f"tp ({lay['tp']}) must divide heads ({m['heads']}) and width "
                   f"({m['width']}): each tensor-parallel rank takes whole heads")
    if lay["pp"] > m["depth"]:
        out.append(f"pp ({lay['pp']}) must be at most depth ({m['depth']}): every stage "
                   f"needs a block")
    if lay["zero_stage"] and lay["dp"] == 1:
        out.append(f"zero_stage {lay['zero_stage']} shards over the data axis, which has "
                   f"one rank here (dp = 1): use zero_stage 0")
    return out


def _shape(q: Question, label: str, fn: Callable[..., Any], args: tuple[Any, ...],
           reader: Callable[[Any], Any], forbid: tuple[str, ...]) -> None:
    if calls.answer(q, label, fn, args, forbid=forbid, reader=reader, gate=True) is not None:
        q.record(label, True, gate=True)


SEED_STATE_CASES: dict[str, dict[str, int]] = {
    "dp 4": {"dp": 4, "pp": 1, "tp": 1, "zero_stage": 0},
    "pp 2 x tp 2": {"dp": 1, "pp": 2, "tp": 2, "zero_stage": 0},
    "dp 2 x pp 2, ZeRO-2": {"dp": 2, "pp": 2, "tp": 1, "zero_stage": 2},
}
"""Visible cases of Q1 (the hidden ones are other models and layouts)."""


def state_question(fn: Callable[..., Any], points: float = 3) -> Question:
    """Q1: the shape of the answer on the visible cases; the values are checked at grading."""
    q = Question("state_bytes", points, ["data and pipeline split", "tensor-parallel slices",
                                          "ZeRO on the data axis"])
    for lay in SEED_STATE_CASES.values():
        _shape(q, "a byte count for each layout", fn, (dict(SEED_LAYOUT), dict(lay)),
               read_bytes, STATE_FORBID)
    return q


def layout_question(fn: Callable[..., Any], points: float = 5) -> Question:
    """Q2: the shape and the hard rules here; the budget, the traffic and the run at grading."""
    q = Question("choose_layout", points, [
        "a factorisation the model allows", "tensor parallelism inside a node",
        "fits the budget (predicted)", "the fewest bytes on the wire among layouts that fit",
        "the real run fits and equals one process"])
    lay = calls.answer(q, "a factorisation the model allows", fn, (dict(SEED_LAYOUT),),
                       forbid=LAYOUT_FORBID, reader=read_layout)
    if lay is not None:
        problems = layout_problems(SEED_LAYOUT, lay)
        q.record("a factorisation the model allows", not problems, "; ".join(problems))
    return q
