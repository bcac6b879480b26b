"""Problem set 4 (reasoning): the scenarios students see, the answer formats, format checks.

Three exercises from the seeds, each answered by a function so hidden variants can test
the reasoning rather than three memorised words:

* ``choose_strategy(scenario) -> {"approach", "fact"}`` (seed 003, Level I): data, sharded,
  model or no distribution, and the one fact (fits-or-not, slow-or-not) that decided it;
* ``propose(challenge) -> config`` (seed 000's mini challenge: 2x faster than one GPU on
  4 GPUs of one node, stable): parallelism, batch, LR policy, precision, overlap;
* ``diagnose(timeline) -> {"kind", "rank", "lever"}`` (seed 003, Level III): a recorded
  timeline of a real run; name the bottleneck, where it is, and the lever that fixes it.

This module holds only what a student may see: the seeds' scenarios, the vocabularies,
and checks that an answer has the right shape. Whether an answer is right is decided on
the instructor's side (``solutions/_grading/ps4_reasoning.py``) by rules that accept every
defensible answer and by the lab's own models, a real run and the timelines' numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from labkit.grading import calls
from labkit.grading.parts import Question

APPROACHES = ("none", "data", "sharded", "model")
FACTS = ("fits", "slow")
PARALLELISM = ("ddp", "zero1", "zero2", "zero3", "fsdp", "pipeline", "tensor")
PRECISIONS = ("fp32", "bf16", "fp16")
KINDS = ("slow_stage", "slow_link", "exposed_allreduce")
LEVERS = ("rebalance_stages", "more_microbatches", "overlap_communication",
          "compress_gradients", "fix_the_link", "bigger_batch", "add_gpus",
          "activation_checkpointing")
CHALLENGE_FORBID = ("labkit.grading",)

# Seed 003, Level I: (a) a ResNet using 12 GB on an 80 GB card but a week to train; (b) a
# 40-billion-parameter transformer; (c) a 200-million-parameter model that trains in two
# hours on one GPU. "Acceptable" is one day: the seed's "a week" is slow, "two hours" is not.
SEED_SCENARIOS: dict[str, dict[str, Any]] = {
    "a": {"model": "ResNet", "params": None, "memory_gb": 12, "gpu_gb": 80,
          "hours_on_one_gpu": 168, "acceptable_hours": 24},
    "b": {"model": "40B transformer", "params": 40e9, "memory_gb": None, "gpu_gb": 80,
          "hours_on_one_gpu": None, "acceptable_hours": 24},
    "c": {"model": "200M model", "params": 200e6, "memory_gb": None, "gpu_gb": 80,
          "hours_on_one_gpu": 2, "acceptable_hours": 24},
}

# Seed 000's mini challenge: 2x faster than one GPU, 4 GPUs on one node, stable. The
# numbers that make it concrete are labkit's own: a 3B model whose one-GPU fp32 step
# (base batch 32, lr 1e-4) takes 0.5 s, GPUs of 80 GB on PCIe 4.0.
SEED_CHALLENGE: dict[str, Any] = {
    "gpus": 4, "gpus_per_node": 4, "gpu_gb": 80, "link": "pcie4", "params": 3e9,
    "step_s_one_gpu": 0.5, "base_batch": 32, "base_lr": 1e-4, "target_speedup": 2.0}

CONFIG_KEYS = {"parallelism": str, "per_gpu_batch": int, "accumulation": int, "lr": float,
               "lr_rule": str, "warmup_steps": int, "precision": str, "loss_scaling": bool,
               "overlap": bool}


def _choice(answer: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str | None:
    value = answer.get(key)
    if not isinstance(value, str) or value not in allowed:
        return f"'{key}' must be one of {', '.join(allowed)}, not {value!r}"
    return None


def read_strategy(value: Any) -> dict[str, Any] | str:
    """The answer as {"approach", "fact"}, or what is wrong with its shape."""
    if not isinstance(value, dict):
        return f"return a dict like {{'approach': 'data', 'fact': 'slow'}}, not {value!r}"
    problem = _choice(value, "approach", APPROACHES) or _choice(value, "fact", FACTS)
    return problem or {"approach": value["approach"], "fact": value["fact"]}


def read_config(value: Any) -> dict[str, Any] | str:
    """The configuration with every key of CONFIG_KEYS, typed, or what is wrong."""
    if not isinstance(value, dict):
        return f"return a dict with keys {', '.join(CONFIG_KEYS)}, not {type(value).__name__}"
    missing = [k for k in CONFIG_KEYS if k not in value]
    if missing:
        return f"the configuration lacks {', '.join(missing)}"
    out: dict[str, Any] = {}
    for key, kind in CONFIG_KEYS.items():
        v = value[key]
        if kind is float and type(v) is int:
            v = float(v)
        if type(v) is not kind:
            return f"'{key}' must be a {kind.__name__}, not {v!r}"
        out[key] = v
    problem = (_choice(out, "parallelism", PARALLELISM) or _choice(out, "precision", PRECISIONS)
               or _choice(out, "lr_rule", ("linear", "sqrt")))
    if problem:
        return problem
    if out["per_gpu_batch"] < 1 or out["accumulation"] < 1 or out["warmup_steps"] < 0 \
            or not out["lr"] > 0:
        return "per_gpu_batch and accumulation must be >= 1, warmup_steps >= 0, lr > 0"
    return out


def read_diagnosis(value: Any) -> dict[str, Any] | str:
    """The diagnosis as {"kind", "rank", "lever"}, or what is wrong with its shape."""
    if not isinstance(value, dict):
        return f"return a dict like {{'kind': 'slow_link', 'rank': 1, 'lever': ...}}, not {value!r}"
    problem = _choice(value, "kind", KINDS) or _choice(value, "lever", LEVERS)
    rank = value.get("rank")
    if problem is None and not (rank is None or (type(rank) is int and rank >= 0)):
        problem = f"'rank' must be a rank number (or None for all ranks), not {rank!r}"
    return problem or {"kind": value["kind"], "rank": rank, "lever": value["lever"]}


def _shape(q: Question, label: str, fn: Callable[..., Any], args: tuple[Any, ...],
           reader: Callable[[Any], dict[str, Any] | str]) -> None:
    if calls.answer(q, label, fn, args, forbid=CHALLENGE_FORBID, reader=reader,
                    gate=True) is not None:
        q.record(label, True, gate=True)


def strategy_question(fn: Callable[..., Any], points: float = 3) -> Question:
    """Level I: the shape checked here on the seed's scenarios; the reasoning at grading."""
    q = Question("choose_strategy", points,
                 [f"({k}) {v['model']}" for k, v in SEED_SCENARIOS.items()]
                 + ["other scenarios (hidden)"])
    for scenario in SEED_SCENARIOS.values():
        _shape(q, "answers in the vocabulary", fn, (dict(scenario),), read_strategy)
    return q


def challenge_question(fn: Callable[..., Any], points: float = 4) -> Question:
    """The mini challenge: the configuration's shape here; models and a real run at grading."""
    q = Question("propose", points, ["fits in memory", "at least the target speedup (lab model)",
                                     "LR follows the global batch, with warmup",
                                     "precision is safe", "stable in a real run on this machine"])
    _shape(q, "a complete configuration", fn, (dict(SEED_CHALLENGE),), read_config)
    return q


def diagnosis_question(fn: Callable[..., Any], traces: str | Path = "traces",
                       points: float = 4) -> Question:
    """Level III: a diagnosis of each public trace, checked here for shape only."""
    from labkit.analysis.timeline import Timeline

    q = Question("diagnose", points, ["the kind of bottleneck", "the rank or stage",
                                      "a lever that fixes it"])
    for path in sorted(Path(traces).glob("*.json")):
        _shape(q, "a diagnosis of each example", fn, (Timeline.load(path),), read_diagnosis)
    return q
