"""Problem set 1, instructor side: answer keys and the randomised hidden inputs.

Every key is computed by ``labkit.theory``, never typed in, so exercises, lessons and quiz
agree. The hidden inputs come from a generator seeded with a value that lives only here
and with the student's id (autograding passes it as ``student_id``): a function that only
returns the worked numbers fails them, and one student's feedback, which names the inputs
of a failed case, tells the class nothing about anyone else's.
"""

from __future__ import annotations

import random
from typing import Any

from labkit import theory
from labkit.grading.numeric import PARTS

SECRET = "ps1-hidden-7f3a"
MAX_DRAWS = 10_000  # per part; the rarest part is about 12 % of the draws


def key_global_batch(gpus: int, per_gpu_batch: int, accumulation: int) -> float:
    return float(theory.global_batch(per_gpu_batch, gpus, accumulation))


def key_target_lr(base_lr: float, base_batch: int, gpus: int, per_gpu_batch: int,
                  accumulation: int) -> float:
    new = theory.global_batch(per_gpu_batch, gpus, accumulation)
    return theory.scaled_lr(base_lr, base_batch, new, "linear")


def key_warmup_lr(target_lr: float, step: int, warmup_steps: int) -> float:
    return theory.warmup_lr(target_lr, step, warmup_steps)


def key_adam_gb_per_gpu(params: float, gpus: int, zero_stage: int) -> float:
    return theory.zero_memory(params, gpus, zero_stage, "mixed", "adam")["total"] / 1e9


def key_bubble_share(stages: int, microbatches: int) -> float:
    return theory.bubble_fraction(stages, microbatches, "1f1b", relative_to="total")


def key_ring_bytes(size_bytes: float, world_size: int) -> float:
    return theory.ring_allreduce_bytes(size_bytes, world_size)


def key_ring_time(size_bytes: float, world_size: int, alpha_s: float,
                  bandwidth_Bps: float) -> float:
    return theory.ring_allreduce_time(size_bytes, world_size, alpha_s, bandwidth_Bps)


KEYS = {"global_batch": key_global_batch, "target_lr": key_target_lr,
        "warmup_lr": key_warmup_lr, "adam_gb_per_gpu": key_adam_gb_per_gpu,
        "bubble_share": key_bubble_share, "ring_bytes": key_ring_bytes,
        "ring_time": key_ring_time}


def _inputs(name: str, rng: random.Random) -> dict[str, Any]:
    if name == "global_batch":
        return {"gpus": rng.choice([1, 2, 4, 6, 8, 16, 64]),
                "per_gpu_batch": rng.choice([8, 16, 24, 32, 48, 128]),
                "accumulation": rng.choice([1, 1, 2, 3, 5, 8])}
    if name == "target_lr":
        return {"base_lr": rng.choice([1e-4, 3e-4, 1e-3, 0.1]),
                "base_batch": rng.choice([32, 64, 256]), "gpus": rng.choice([2, 4, 8, 32]),
                "per_gpu_batch": rng.choice([16, 32, 64]),
                "accumulation": rng.choice([1, 1, 2, 3, 4])}
    if name == "warmup_lr":
        warm = rng.choice([100, 500, 2000])
        return {"target_lr": rng.choice([0.004, 0.01, 3e-4]),
                "step": rng.randint(0, 2 * warm), "warmup_steps": warm}
    if name == "adam_gb_per_gpu":
        return {"params": rng.choice([1.3e9, 7e9, 7.5e9, 13e9, 70e9]),
                "gpus": rng.choice([2, 8, 16, 64]), "zero_stage": rng.randint(0, 3)}
    if name == "bubble_share":
        return {"stages": rng.randint(2, 16), "microbatches": rng.randint(1, 64)}
    if name == "ring_bytes":
        return {"size_bytes": rng.choice([1e6, 2.5e8, 1.4e10]), "world_size": rng.randint(2, 64)}
    return {"size_bytes": rng.choice([2e5, 1e6, 2.5e8, 1.4e10]), "world_size": rng.randint(2, 64),
            "alpha_s": rng.choice([2e-6, 1e-5, 5e-5]),
            "bandwidth_Bps": rng.choice([1.25e9, 25e9, 450e9])}


def cases(name: str, student: str = "", count: int = 25) -> list[tuple[dict[str, Any], float]]:
    """``count`` hidden (inputs, expected) pairs for exercise ``name``, drawn for ``student``,
    then, for each scored part (``numeric.PARTS``) that no draw reached, further draws until
    one does: a part no case reaches earns nothing, so without them about one student in 22
    lost a point of ``bubble_share`` (fewer microbatches than stages is 12 % of the draws)."""
    rng = random.Random(f"{SECRET}:{name}:{student}")
    drawn = [_inputs(name, rng) for _ in range(count)]
    for label, rule in PARTS[name]:
        if any(rule(**kwargs) for kwargs in drawn):
            continue
        found = next((kw for kw in (_inputs(name, rng) for _ in range(MAX_DRAWS)) if rule(**kw)),
                     None)
        if found is None:
            raise RuntimeError(f"{name}: {MAX_DRAWS} draws never reached the part {label!r}")
        drawn.append(found)
    return [(kwargs, KEYS[name](**kwargs)) for kwargs in drawn]
