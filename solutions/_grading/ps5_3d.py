"""Problem set 5, instructor side: the hidden models and scenarios, and the rules that grade.

Q1 (``state_bytes``): the student's count of the fullest rank's model state is compared,
within 0.1% (the count is exact arithmetic), with ``labkit.theory.parallel_layout`` (the
prediction lesson 09 checks against measured tensors), on the visible layouts and on
hidden models and layouts.

Q2 (``choose_layout``): the layout must be a factorisation the model allows, keep tensor
parallelism inside a node, fit the budget by the lab's prediction and, of every layout that
fits, send the fewest bytes per step (within 1%: ZeRO-1 and 2 send what ZeRO-0 sends, so
ties are common and all accepted). For the seed scenario the layout is then run for real
(``labkit.run("hybrid")`` on 4 ranks, the lesson GPT, 3 steps): the measured model state of
every rank must fit the budget and the weights must equal one process on the global batch
(max abs difference <= 1e-5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from labkit import theory
from labkit.grading import calls
from labkit.grading.layout3d import (
    LAYOUT_FORBID,
    SEED_LAYOUT,
    SEED_STATE_CASES,
    STATE_FORBID,
    layout_problems,
    read_bytes,
    read_layout,
)
from labkit.grading.parts import Question

OPTIMIZER_OF_BYTES = {0: "sgd", 4: "momentum", 8: "adam"}
"""Optimizer-state bytes per fp32 parameter -> the optimizer ``theory.zero_memory`` knows."""
REFERENCE_TOLERANCE = 1e-5

_WIDE = {"vocab": 200, "width": 128, "depth": 6, "heads": 8, "seq_len": 64}
_ADAM = {"params": 4, "grads": 4, "optimizer": 8}

HIDDEN_STATE: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "lesson GPT, pp 4": (SEED_LAYOUT, {"dp": 1, "pp": 4, "tp": 1, "zero_stage": 0}),
    "lesson GPT, tp 4": (SEED_LAYOUT, {"dp": 1, "pp": 1, "tp": 4, "zero_stage": 0}),
    "lesson GPT, dp 4 ZeRO-3": (SEED_LAYOUT, {"dp": 4, "pp": 1, "tp": 1, "zero_stage": 3}),
    "wide GPT, Adam, pp 4 (6 blocks)": (
        {**SEED_LAYOUT, "model": _WIDE, "world_size": 8, "bytes_per_param": _ADAM},
        {"dp": 2, "pp": 4, "tp": 1, "zero_stage": 0}),
    "wide GPT, Adam, dp 2 x pp 2 x tp 2, ZeRO-1": (
        {**SEED_LAYOUT, "model": _WIDE, "world_size": 8, "bytes_per_param": _ADAM},
        {"dp": 2, "pp": 2, "tp": 2, "zero_stage": 1}),
    "wide GPT, Adam, tp 8": (
        {**SEED_LAYOUT, "model": _WIDE, "world_size": 8, "bytes_per_param": _ADAM},
        {"dp": 1, "pp": 1, "tp": 8, "zero_stage": 0}),
    "wide GPT, Adam, dp 4 x tp 2, ZeRO-2": (
        {**SEED_LAYOUT, "model": _WIDE, "world_size": 8, "bytes_per_param": _ADAM},
        {"dp": 4, "pp": 1, "tp": 2, "zero_stage": 2}),
}

HIDDEN_LAYOUTS: dict[str, dict[str, Any]] = {
    "8 ranks, 4 per node, 0.6 MB": {**SEED_LAYOUT, "world_size": 8, "budget_bytes": 600_000},
    "3 blocks, 4 ranks, 2 per node, 0.9 MB": {
        **SEED_LAYOUT, "model": {**SEED_LAYOUT["model"], "depth": 3}, "ranks_per_node": 2,
        "budget_bytes": 900_000},
    "6 blocks, 4 ranks, 2 per node, 1.2 MB": {
        **SEED_LAYOUT, "model": {**SEED_LAYOUT["model"], "depth": 6}, "ranks_per_node": 2,
        "budget_bytes": 1_200_000},
    "wide GPT, Adam, 8 ranks, 4 per node, 3 MB": {
        **SEED_LAYOUT, "model": _WIDE, "world_size": 8, "bytes_per_param": _ADAM,
        "budget_bytes": 3_000_000},
}


def predict(scenario: Mapping[str, Any], lay: Mapping[str, int]) -> theory.Layout3D:
    """The lab's prediction of ``lay`` on ``scenario`` (memory per rank, bytes per axis)."""
    m, per = scenario["model"], scenario["bytes_per_param"]
    return theory.parallel_layout(
        kind="gpt", width=m["width"], depth=m["depth"], heads=m["heads"],
        seq_len=m["seq_len"], vocab=m["vocab"], dp=lay["dp"], pp=lay["pp"], tp=lay["tp"],
        microbatches=scenario["microbatches"], batch_size=scenario["batch_size"],
        zero_stage=lay["zero_stage"], optimizer=OPTIMIZER_OF_BYTES[per["optimizer"]])


def tp_outside_node(scenario: Mapping[str, Any], lay: Mapping[str, int]) -> str | None:
    node = scenario["ranks_per_node"]
    if lay["tp"] > node or node % lay["tp"]:
        return (f"tp ({lay['tp']}) must fit inside a node of {node} ranks (and divide it): "
                f"tensor parallelism all-reduces activations in every block, so its group "
                f"must share the fast link")
    return None


def admissible(scenario: Mapping[str, Any]) -> list[dict[str, int]]:
    """Every layout the rules allow: factorisations, TP inside a node, ZeRO only with dp > 1."""
    world = scenario["world_size"]
    out = []
    for tp in range(1, world + 1):
        for pp in range(1, world // tp + 1):
            dp, rest = divmod(world, tp * pp)
            if rest:
                continue
            for stage in range(4 if dp > 1 else 1):
                lay = {"dp": dp, "pp": pp, "tp": tp, "zero_stage": stage}
                if not layout_problems(scenario, lay) and tp_outside_node(scenario, lay) is None:
                    out.append(lay)
    return out


def wire_bytes(scenario: Mapping[str, Any], lay: Mapping[str, int]) -> float:
    return sum(predict(scenario, lay).traffic.values())


def fewest_bytes(scenario: Mapping[str, Any]) -> tuple[float, dict[str, int]]:
    """The least traffic of any admissible layout that fits the budget, and one such layout."""
    fits = [lay for lay in admissible(scenario)
            if predict(scenario, lay).max_memory() <= scenario["budget_bytes"]]
    best = min(fits, key=lambda lay: wire_bytes(scenario, lay))
    return wire_bytes(scenario, best), best


# --- Q1 --------------------------------------------------------------------------------------

def _state_part(lay: Mapping[str, int]) -> str:
    if lay["zero_stage"]:
        return "ZeRO on the data axis"
    return "tensor-parallel slices" if lay["tp"] > 1 else "data and pipeline split"


def check_state(q: Question, fn: Any) -> None:
    cases = {**{k: (SEED_LAYOUT, v) for k, v in SEED_STATE_CASES.items()}, **HIDDEN_STATE}
    for label, (scenario, lay) in cases.items():
        part = _state_part(lay)
        got = calls.answer(q, part, fn, (dict(scenario), dict(lay)), forbid=STATE_FORBID,
                           reader=read_bytes, where=label)
        if got is None:
            continue
        want = predict(scenario, lay).max_memory()
        q.record(part, abs(got - want) <= 1e-3 * want,
                 f"{label}: {got:,.0f} bytes, expected {want:,.0f}. Count one stage's blocks "
                 "(the first stages take one more when pp does not divide depth), add the "
                 "embedding to the first stage and the final LayerNorm and head to the last; "
                 "tp divides a block's 12h^2 + 7h split weights but not its 6h LayerNorm and "
                 "row-parallel biases; ZeRO stage s divides by dp: optimizer state from 1, "
                 "gradients from 2, parameters at 3")


# --- Q2 --------------------------------------------------------------------------------------

def lab_run(scenario: Mapping[str, Any], lay: Mapping[str, int]) -> tuple[bool, str]:
    """Run ``lay`` for real: the lesson GPT on the grid, 3 steps, checked against one process."""
    import labkit
    from labkit.config import ModelConfig

    m = scenario["model"]
    res = labkit.run(
        strategy="hybrid", world_size=scenario["world_size"], steps=3,
        batch_size=scenario["batch_size"], optimizer=OPTIMIZER_OF_BYTES[
            scenario["bytes_per_param"]["optimizer"]],
        model=ModelConfig(kind="gpt", width=m["width"], depth=m["depth"], heads=m["heads"],
                          seq_len=m["seq_len"]),
        options={**lay, "microbatches": scenario["microbatches"]}, check_reference=True,
        backend="gloo", timeout_s=120, progress=False, seed=0)
    fullest = max(sum(rank.values()) for rank in res.metrics["per_rank_bytes"])
    diff = res.metrics["max_abs_diff_vs_reference"]
    ok = fullest <= scenario["budget_bytes"] and diff <= REFERENCE_TOLERANCE
    return ok, (f"measured: the fullest rank holds {fullest:,} bytes (budget "
                f"{scenario['budget_bytes']:,}); max |w - w_one_process| = {diff:.1e} "
                f"(must be <= {REFERENCE_TOLERANCE:g})")


def check_layout(q: Question, fn: Any, real_run: bool = True) -> None:
    cases = {"seed: the lesson GPT, 4 ranks, 1 MB": SEED_LAYOUT, **HIDDEN_LAYOUTS}
    for label, scenario in cases.items():
        lay = calls.answer(q, "a factorisation the model allows", fn, (dict(scenario),),
                           forbid=LAYOUT_FORBID, reader=read_layout, where=label)
        if lay is None:
            continue
        problems = layout_problems(scenario, lay)
        q.record("a factorisation the model allows", not problems,
                 f"{label}: {'; '.join(problems)}")
        if problems:
            continue
        outside = tp_outside_node(scenario, lay)
        q.record("tensor parallelism inside a node", outside is None, f"{label}: {outside}")
        pred = predict(scenario, lay)
        q.record("fits the budget (predicted)", pred.max_memory() <= scenario["budget_bytes"],
                 f"{label}: the fullest rank of {lay} holds {pred.max_memory():,.0f} bytes, "
                 f"over the budget of {scenario['budget_bytes']:,}. Split more: pipeline "
                 "stages and tensor slices divide the weights, ZeRO divides over dp")
        least, best = fewest_bytes(scenario)
        mine = wire_bytes(scenario, lay)
        q.record("the fewest bytes on the wire among layouts that fit", mine <= 1.01 * least,
                 f"{label}: {lay} sends {mine:,.0f} bytes per step; a layout that fits "
                 f"sends {least:,.0f}. Compare the axes: tensor parallelism all-reduces "
                 "activations in every block, data parallelism the gradients once a step "
                 "(ZeRO-3 gathers the weights again for every microbatch), a pipeline sends "
                 "one activation per microbatch per cut")
        if real_run and label.startswith("seed") and outside is None:
            ok, why = lab_run(scenario, lay)
            q.record("the real run fits and equals one process", ok, f"{label}: {why}")
