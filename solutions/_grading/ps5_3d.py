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

The hidden models, layouts and scenarios are drawn from a generator seeded with ``SECRET``
and the student's id (autograding passes it as ``student_id``); a hidden case's feedback
names its inputs, never the expected count or the least traffic.
"""

from __future__ import annotations

import random
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

_ADAM = {"params": 4, "grads": 4, "optimizer": 8}
SECRET = "ps5-hidden-93b1"
STATE_KINDS = ("data and pipeline split", "data and pipeline split", "tensor-parallel slices",
               "tensor-parallel slices", "ZeRO on the data axis", "ZeRO on the data axis",
               "ZeRO on the data axis")
NODES = ((8, 4), (4, 2), (8, 2), (8, 4))
"""(world size, ranks per node) of the hidden layout scenarios: TP can leave a node in each."""


def _rng(student: str, what: str) -> random.Random:
    return random.Random(f"{SECRET}:{what}:{student}")


def _scenario(rng: random.Random, world: int, per_node: int) -> dict[str, Any]:
    """A GPT of random size on ``world`` ranks, momentum or Adam (budget set later)."""
    heads = rng.choice((4, 8))
    model = {"vocab": rng.randint(60, 260), "width": heads * rng.choice((8, 12, 16)),
             "depth": rng.randint(3, 8), "heads": heads, "seq_len": rng.choice((16, 32, 64))}
    return {**SEED_LAYOUT, "model": model, "world_size": world, "ranks_per_node": per_node,
            "bytes_per_param": rng.choice((SEED_LAYOUT["bytes_per_param"], _ADAM))}


def _layouts(scenario: Mapping[str, Any]) -> list[dict[str, int]]:
    """Every layout the model allows on the scenario's world (TP may leave a node)."""
    world = scenario["world_size"]
    out = []
    for tp in (t for t in range(1, world + 1) if world % t == 0):
        for pp in (p for p in range(1, world // tp + 1) if (world // tp) % p == 0):
            for stage in range(4):
                lay = {"dp": world // (tp * pp), "pp": pp, "tp": tp, "zero_stage": stage}
                if not layout_problems(scenario, lay):
                    out.append(lay)
    return out


def hidden_state(student: str) -> dict[str, tuple[dict[str, Any], dict[str, int]]]:
    """Seven (model, layout) cases drawn for ``student``: each part's kind at least twice."""
    rng = _rng(student, "state")
    out = {}
    for i, kind in enumerate(STATE_KINDS):
        while True:
            scenario = _scenario(rng, rng.choice((4, 8)), 4)
            fits = [lay for lay in _layouts(scenario) if _state_part(lay) == kind
                    and (lay["pp"] > 1 or lay["tp"] > 1 or lay["zero_stage"])]
            if fits:
                out[f"hidden model {i + 1}"] = (scenario, rng.choice(fits))
                break
    return out


def hidden_layouts(student: str) -> dict[str, dict[str, Any]]:
    """Four scenarios drawn for ``student``, each with a budget some admissible layouts fit
    and others do not (so the choice matters)."""
    rng = _rng(student, "layouts")
    out = {}
    for i, (world, per_node) in enumerate(NODES):
        while True:
            scenario = _scenario(rng, world, per_node)
            sizes = sorted({predict(scenario, lay).max_memory() for lay in admissible(
                {**scenario, "budget_bytes": 0})})
            if len(sizes) >= 4:
                budget = sizes[rng.randint(len(sizes) // 4, len(sizes) // 2)]
                out[f"hidden scenario {i + 1}: {world} ranks, {per_node} per node"] = {
                    **scenario, "budget_bytes": int(budget) + 1}
                break
    return out


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


def check_state(q: Question, fn: Any, student: str = "") -> None:
    cases = {**{k: (SEED_LAYOUT, v) for k, v in SEED_STATE_CASES.items()},
             **hidden_state(student)}
    for label, (scenario, lay) in cases.items():
        part = _state_part(lay)
        where = label if label in SEED_STATE_CASES else f"{label}: {scenario['model']}, {lay}"
        got = calls.answer(q, part, fn, (dict(scenario), dict(lay)), forbid=STATE_FORBID,
                           reader=read_bytes, where=where)
        if got is None:
            continue
        want = predict(scenario, lay).max_memory()
        said = f", expected {want:,.0f}" if label in SEED_STATE_CASES else " (hidden case)"
        q.record(part, abs(got - want) <= 1e-3 * want,
                 f"{where}: {got:,.0f} bytes{said}. Count one stage's blocks "
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


def check_layout(q: Question, fn: Any, student: str = "", real_run: bool = True) -> None:
    cases = {"seed: the lesson GPT, 4 ranks, 1 MB": SEED_LAYOUT, **hidden_layouts(student)}
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
                 + (f"sends {least:,.0f}" if label.startswith("seed") else "sends fewer") +
                 ". Compare the axes: tensor parallelism all-reduces "
                 "activations in every block, data parallelism the gradients once a step "
                 "(ZeRO-3 gathers the weights again for every microbatch), a pipeline sends "
                 "one activation per microbatch per cut")
        if real_run and label.startswith("seed") and outside is None:
            ok, why = lab_run(scenario, lay)
            q.record("the real run fits and equals one process", ok, f"{label}: {why}")
