"""Problem set 7, instructor side: the hidden scenarios, drawn per student, and the checks.

Every key is ``labkit.theory.plan`` (``labkit.grading.at_scale``: the planner's model-state
terms, its MFU, its ``predict`` of the student's layout and its best layout). The hidden
scenarios come from a generator seeded with a value that lives only here and the student's
id (autograding passes it as ``student_id``): decoders of Llama's shape (GQA, SwiGLU, RoPE)
and of GPT's (multi-head attention, a 4h FFN, biases, learned positions) at 4-8K width, 32-80
layers, on A100 80 GB, H100 or H200 nodes of 8, 64-512 GPUs, 0.5-2K sequences a step.
"""

from __future__ import annotations

import random
from typing import Any

from labkit.grading.at_scale import check_mfu, check_plan, check_state
from labkit.grading.parts import Question
from labkit.theory.plan_models import GPUS

SECRET = "ps7-hidden-c41e"


def scenario(rng: random.Random, llama: bool) -> dict[str, Any]:
    """One hidden scenario, of Llama's shape or of GPT's."""
    h = rng.choice([4096, 5120, 6144, 8192])
    layers = rng.choice([32, 40, 48, 60, 64, 80])
    if llama:
        model = {"layers": layers, "hidden": h, "heads": h // 128, "kv_heads": 8,
                 "ffn": int(3.5 * h) // 256 * 256, "swiglu": True, "vocab": 128256,
                 "seq": rng.choice([4096, 8192]), "bias": False, "learned_positions": False}
    else:
        model = {"layers": layers, "hidden": h, "heads": h // 128, "kv_heads": h // 128,
                 "ffn": 4 * h, "swiglu": False, "vocab": 51200, "seq": 2048, "bias": True,
                 "learned_positions": True}
    g = GPUS[rng.choice(["a100-80gb", "h100-sxm", "h200"])]
    gpu = {"name": g.name, "bf16_tflops": g.bf16_flops / 1e12, "memory_gb": g.memory_bytes / 1e9,
           "mamf": g.mamf, "nvlink_GBps": g.nvlink.bandwidth_Bps / 1e9}
    return {"model": model, "gpu": gpu, "gpus": rng.choice([64, 128, 256, 512]), "per_node": 8,
            "global_batch_tokens": model["seq"] * rng.choice([512, 1024, 2048])}


def scenarios(student: str = "", count: int = 3, part: str = "plan") -> list[dict[str, Any]]:
    """``count`` hidden scenarios of ``part`` drawn for ``student``, the two shapes in turn
    (so every part of a question is reached), which one first drawn too."""
    rng = random.Random(f"{SECRET}:{part}:{student}")
    first = rng.random() < 0.5
    return [scenario(rng, (k % 2 == 0) == first) for k in range(count)]


def state_cases(student: str = "", count: int = 12) -> list[tuple[dict[str, Any], dict[str, int]]]:
    """Hidden (scenario, layout) pairs for Q1: every split, some uneven, ZeRO 0-3."""
    rng = random.Random(f"{SECRET}:state:{student}")
    out = []
    for k, sc in enumerate(scenarios(student, count, "state")):
        tp = rng.choice([1, 2, 4, 8])
        even = [p for p in (1, 2, 4, 8, 16) if sc["model"]["layers"] % p == 0]
        pp = rng.choice(even) if k % 3 else 7  # 7 divides none of the depths: uneven stages
        zero = 0 if pp == 7 else k % 4 if pp == 1 else min(k % 4, 2)  # ZeRO-3: no pipeline
        out.append((sc, {"dp": rng.choice([1, 4, 16, 64]), "tp": tp, "pp": pp, "zero": zero}))
    return out


def mfu_cases(student: str = "", count: int = 8) -> list[tuple[dict[str, Any], float]]:
    """Hidden (scenario, tokens/s per GPU) pairs for Q2."""
    rng = random.Random(f"{SECRET}:mfu:{student}")
    return [(sc, float(rng.choice([150, 400, 900, 1500, 3000])))
            for sc in scenarios(student, count, "mfu")]


def grade_state(q: Question, fn: Any, student: str = "") -> None:
    check_state(q, fn, state_cases(student))


def grade_mfu(q: Question, fn: Any, student: str = "") -> None:
    check_mfu(q, fn, mfu_cases(student))


def grade_plan(q: Question, fn: Any, student: str = "") -> None:
    check_plan(q, fn, scenarios(student))
