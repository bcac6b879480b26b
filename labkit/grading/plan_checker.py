"""The parallelism-plan checker: is a student's plan feasible, and if not, why not?

A plan chooses tensor (``tp``), pipeline (``pp``) and data (``dp``) parallel degrees, a ZeRO
stage, activation checkpointing and (with a pipeline) the number of microbatches. There is
rarely one right answer, so the checker grades by RULES, not by comparing with a key, and
accepts every plan that passes all of them:

1. the degrees use the GPUs exactly: ``tp * pp * dp == gpus``;
2. it fits in memory: ``labkit.theory.fits`` (model states per GPU under ZeRO, after the tp*pp
   split) plus activations per GPU (the scenario's estimate, divided by tp because tensor
   parallelism splits each layer's activations; with checkpointing only the scenario's
   ``checkpoint_factor`` of them is kept; a 1F1B pipeline keeps about the same amount per
   stage: 1/pp of the layers, up to pp microbatches in flight);
3. the bubble is acceptable: with pp > 1, ``bubble_fraction(pp, m, "1f1b")`` as a share of
   the total step must not exceed the scenario's ``max_bubble``;
4. tensor parallelism stays inside a node: ``tp`` divides ``gpus_per_node``, because TP
   all-reduces activations in every layer on the critical path (Megatron-LM), and the link
   between nodes is many times slower than the one inside (``labkit.theory`` presets).

Scenarios come from the seeds: 000's 3B-parameter BF16 Adam model on 4 x 24 GB GPUs, and
003's "a model that needs about 320 GB to train" on 8-GPU nodes of 80 GB (NVLink inside,
InfiniBand between).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit import theory
from labkit.grading.checks import NotANumber, Verdict, as_number
from labkit.grading.parts import Question

PLAN_KEYS = ("tp", "pp", "dp", "zero_stage", "checkpointing", "microbatches")
RULES = ("tp x pp x dp uses every GPU", "fits in memory", "bubble within the limit",
         "tensor parallelism inside a node")


@dataclass(frozen=True)
class Scenario:
    """A model and a cluster to plan for."""

    name: str
    params: float  # parameter count
    gpus: int  # GPUs in all
    gpu_gb: float  # memory per GPU, GB (1e9 B)
    gpus_per_node: int
    activation_gb: float  # activations per GPU without checkpointing, tp=1, GB
    checkpoint_factor: float = 0.25  # share of activations kept with checkpointing
    max_bubble: float = 0.2  # largest acceptable bubble, share of the total step
    intra_link: str = "nvlink4"
    inter_link: str = "infiniband_hdr"


SCENARIOS: dict[str, Scenario] = {
    # seed 000, exercise 2: 3B params, BF16, Adam, 4 x 24 GB on one node
    "seed_3b_4x24gb": Scenario("seed_3b_4x24gb", params=3e9, gpus=4, gpu_gb=24,
                               gpus_per_node=4, activation_gb=6.0, intra_link="pcie4"),
    # seed 003, Level III: ~320 GB to train = 20e9 params x 16 B (mixed Adam); 4 nodes x 8 x 80 GB
    "seed_320gb_multinode": Scenario("seed_320gb_multinode", params=20e9, gpus=32, gpu_gb=80,
                                     gpus_per_node=8, activation_gb=40.0, max_bubble=0.25),
}


@dataclass
class PlanReport:
    """The checker's answer: feasible or not, every reason, and the numbers behind them."""

    feasible: bool
    reasons: list[str]  # why it fails (empty when feasible)
    notes: list[str]  # what was checked, with numbers
    per_gpu_gb: float | None = None
    bubble: float | None = None
    rules: dict[str, str | None] = field(default_factory=dict)
    """Each of ``RULES`` -> why it fails, or None when it holds."""

    def verdict(self) -> Verdict:
        if self.feasible:
            return Verdict(True, "Feasible plan. " + " ".join(self.notes))
        return Verdict(False, "Infeasible plan:\n- " + "\n- ".join(self.reasons))


def _read_plan(plan: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Convert the student's dict to plain ints / bool; list what is malformed."""
    problems: list[str] = []
    if not isinstance(plan, Mapping):
        return {}, [(f"the plan must be a dict with keys {', '.join(PLAN_KEYS)}; "
                     f"got {type(plan).__name__}")]
    out: dict[str, Any] = {}
    for key in ("tp", "pp", "dp", "zero_stage", "microbatches"):
        default = 1 if key in ("tp", "pp", "dp", "microbatches") else 0
        try:
            number = as_number(plan.get(key, default), key)
        except NotANumber as exc:
            problems.append(f"{exc}; e.g. {key}=2")
            continue
        if number != int(number) or number < (0 if key == "zero_stage" else 1):
            problems.append(f"{key} ({plan.get(key)!r}) must be a whole number >= "
                            f"{0 if key == 'zero_stage' else 1}; e.g. {key}=2")
            continue
        out[key] = int(number)
    ckpt = plan.get("checkpointing", False)
    if type(ckpt) is not bool:
        problems.append(f"checkpointing ({ckpt!r}) must be True or False")
    out["checkpointing"] = ckpt is True
    if out.get("zero_stage", 0) > 3:
        problems.append(f"zero_stage ({out['zero_stage']}) must be 0, 1, 2 or 3")
    unknown = sorted(set(plan) - set(PLAN_KEYS))
    if unknown:
        problems.append(f"unknown key(s) {unknown}; a plan has {', '.join(PLAN_KEYS)}")
    return out, problems


def check_plan(plan: Mapping[str, Any], scenario: Scenario | str) -> PlanReport:
    """Apply the four rules to ``plan`` for ``scenario``; every failing rule is explained."""
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    p, problems = _read_plan(plan)
    if problems:
        return PlanReport(False, problems, [], rules=dict.fromkeys(RULES, problems[0]))
    tp, pp, dp, stage, m = p["tp"], p["pp"], p["dp"], p["zero_stage"], p["microbatches"]
    reasons: list[str] = []
    notes: list[str] = []
    # 1. the degrees multiply to the GPU count
    if tp * pp * dp != sc.gpus:
        reasons.append(f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp}, but there are "
                       f"{sc.gpus} GPUs: choose degrees whose product is {sc.gpus}.")
        later = "not checked: first make tp x pp x dp equal the GPU count"
        return PlanReport(False, reasons, notes,
                          rules={RULES[0]: reasons[0], **dict.fromkeys(RULES[1:], later)})
    rules: dict[str, str | None] = dict.fromkeys(RULES)
    # 2. memory: model states via theory.fits, activations from the scenario
    act = sc.activation_gb * (sc.checkpoint_factor if p["checkpointing"] else 1.0) / tp
    fit = theory.fits(sc.params, gpus=sc.gpus, gpu_gb=sc.gpu_gb, stage=stage, tp=tp, pp=pp,
                      activation_gb=act)
    per_gpu = fit.per_gpu_bytes["total"] / 1e9
    if fit.fits:
        notes.append(f"Memory: {per_gpu:.1f} of {sc.gpu_gb:g} GB per GPU.")
    else:
        tip = ("turn on activation checkpointing, " if not p["checkpointing"]
               and fit.binding == "activations" else "")
        reasons.append(f"Memory: {fit.explanation} Try {tip}a higher ZeRO stage, or more "
                       f"tensor/pipeline parallelism to split the model.")
        rules[RULES[1]] = reasons[-1]
    # 3. bubble, as a share of the total step (1F1B has GPipe's bubble)
    bubble = None
    if pp > 1:
        bubble = theory.bubble_fraction(pp, m, "1f1b", relative_to="total")
        if bubble > sc.max_bubble:
            need = next(k for k in itertools.count(1)
                        if theory.bubble_fraction(pp, k, "1f1b") <= sc.max_bubble)
            reasons.append(f"Bubble: {pp} stages with {m} microbatches idle "
                           f"(p-1)/(m+p-1) = {bubble:.0%} of the step, above the "
                           f"{sc.max_bubble:.0%} allowed. Use at least {need} microbatches "
                           f"or fewer stages.")
            rules[RULES[2]] = reasons[-1]
        else:
            notes.append(f"Bubble: {bubble:.0%} of the step.")
    # 4. tensor parallelism inside one node
    if tp > 1 and sc.gpus_per_node % tp != 0:
        intra, inter = theory.get_link(sc.intra_link), theory.get_link(sc.inter_link)
        ratio = intra.bandwidth_Bps / inter.bandwidth_Bps
        reasons.append(f"Tensor parallel: tp={tp} does not fit inside a node of "
                       f"{sc.gpus_per_node} GPUs, so every layer's all-reduces would cross "
                       f"{inter.name} ({inter.bandwidth_Bps / 1e9:g} GB/s) instead of "
                       f"{intra.name} ({intra.bandwidth_Bps / 1e9:g} GB/s), {ratio:.0f}x "
                       f"slower, on the critical path. Keep tp a divisor of "
                       f"{sc.gpus_per_node}; span nodes with pipeline or data parallelism.")
        rules[RULES[3]] = reasons[-1]
    return PlanReport(not reasons, reasons, notes, per_gpu_gb=per_gpu, bubble=bubble,
                      rules=rules)


def plan_question(name: str, plan: Mapping[str, Any], scenario: Scenario | str,
                  points: float) -> Question:
    """A partial-credit question: one part per rule, each with the checker's reason.

    Using every GPU and fitting in memory are gates (a plan that does not fit does not
    run at all); the bubble and where tensor parallelism sits share the points (a plan
    that breaks them runs, slowly).
    """
    q = Question(name, points)
    report = check_plan(plan, scenario)
    for i, rule in enumerate(RULES):
        why = report.rules.get(rule)
        q.record(rule, why is None, why or "", gate=i < 2)
    return q


def all_plans(scenario: Scenario | str, microbatches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
              ) -> Iterator[dict[str, Any]]:
    """Every plan in the search space of ``scenario`` (for tests and for "show me one")."""
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    for tp in range(1, sc.gpus + 1):
        for pp in range(1, sc.gpus // tp + 1):
            if sc.gpus % (tp * pp):
                continue
            for stage, ckpt, m in itertools.product(range(4), (False, True),
                                                    microbatches if pp > 1 else (1,)):
                yield {"tp": tp, "pp": pp, "dp": sc.gpus // (tp * pp), "zero_stage": stage,
                       "checkpointing": ckpt, "microbatches": m}
