"""Answer keys and checks for problem set 1 (the numbers of distributed training).

Every key is computed by ``labkit.theory``, never typed in, so the exercises, the lessons and
the quiz agree. Visible tests use the seed lesson's worked numbers (8 GPUs x 32 per GPU x 4
accumulation = 1024; 0.001 at 256 -> 0.004; 0.002 at step 250 of a 500-step warmup; a 3B
Adam model on 4 x 24 GB needs 48 GB per GPU without ZeRO); hidden tests draw randomised
variants from a seeded generator, so a function that only returns the worked numbers fails.

Conventions stated to the student in the notebook: GB = 1e9 bytes; mixed-precision Adam
is 16 bytes per parameter (2 weights + 2 grads + 12 optimizer incl. fp32 master);
bubble as a share of the TOTAL step time, ``(p-1)/(m+p-1)``; ring bytes are what each rank
sends, ``2(n-1)/n x size``; ring time is the alpha-beta model ``2(n-1)alpha + bytes/bw``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from labkit import theory
from labkit.grading.checks import Verdict, check_function

Case = tuple[dict[str, Any], float]


# --- answer keys ------------------------------------------------------------------------------

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


# The seed's worked examples (visible tests) and seed 003's Level II numbers: inputs only,
# the expected values come from ``KEYS`` (tests/unit/test_grading_numeric.py pins them to the
# seeds' printed answers: 1024, 0.004, 0.002, 48 / 16.5 / 12 GB, 3/11, ...).
SEED_INPUTS: dict[str, list[dict[str, Any]]] = {
    "global_batch": [{"gpus": 8, "per_gpu_batch": 32, "accumulation": 4},
                     {"gpus": 8, "per_gpu_batch": 64, "accumulation": 1}],
    "target_lr": [{"base_lr": 0.001, "base_batch": 256, "gpus": 8, "per_gpu_batch": 32,
                   "accumulation": 4},
                  {"base_lr": 1e-3, "base_batch": 64, "gpus": 8, "per_gpu_batch": 64,
                   "accumulation": 1}],
    "warmup_lr": [{"target_lr": 0.004, "step": 250, "warmup_steps": 500},
                  {"target_lr": 0.004, "step": 900, "warmup_steps": 500}],
    "adam_gb_per_gpu": [{"params": 3e9, "gpus": 4, "zero_stage": 0},
                        {"params": 3e9, "gpus": 4, "zero_stage": 2},
                        {"params": 3e9, "gpus": 4, "zero_stage": 3}],
    "bubble_share": [{"stages": 4, "microbatches": 8}],
    "ring_bytes": [{"size_bytes": 4e9, "world_size": 8}],
    "ring_time": [{"size_bytes": 4e9, "world_size": 8, "alpha_s": 5e-6,
                   "bandwidth_Bps": 25e9}],
}

KEYS: dict[str, Callable[..., float]] = {
    "global_batch": key_global_batch, "target_lr": key_target_lr,
    "warmup_lr": key_warmup_lr, "adam_gb_per_gpu": key_adam_gb_per_gpu,
    "bubble_share": key_bubble_share, "ring_bytes": key_ring_bytes, "ring_time": key_ring_time,
}

HINTS = {
    "global_batch": "multiply GPUs x per-GPU batch x accumulation steps: every micro-batch "
                    "on every GPU feeds the same optimizer step.",
    "target_lr": "compute the new global batch first, then scale: base_lr x new / base.",
    "warmup_lr": "a linear warmup goes from 0 at step 0 to target at warmup_steps, and stays "
                 "at target afterwards: target x min(1, step / warmup_steps).",
    "adam_gb_per_gpu": "count 2 B weights + 2 B grads + 12 B optimizer per parameter; ZeRO-1 "
                       "divides the optimizer by the GPUs, ZeRO-2 also the grads, ZeRO-3 also "
                       "the weights. Report GB = 1e9 bytes.",
    "bubble_share": "the pipeline runs m + p - 1 slots, p - 1 of them idle: (p-1)/(m+p-1), "
                    "a share of the total step (not (p-1)/m).",
    "ring_bytes": "reduce-scatter and all-gather each send n-1 chunks of size/n.",
    "ring_time": "2(n-1) messages each pay alpha, and the bytes each rank sends cross the "
                 "link at bandwidth_Bps.",
}


def _variants(name: str, seed: int, count: int) -> Iterator[Case]:
    """Randomised inputs for hidden tests; the key is computed, never stored."""
    rng = random.Random(f"{name}:{seed}")
    for _ in range(count):
        if name == "global_batch":
            kw: dict[str, Any] = {"gpus": rng.choice([1, 2, 4, 6, 8, 16, 64]),
                                  "per_gpu_batch": rng.choice([8, 16, 24, 32, 48, 128]),
                                  "accumulation": rng.randint(1, 8)}
        elif name == "target_lr":
            kw = {"base_lr": rng.choice([1e-4, 3e-4, 1e-3, 0.1]),
                  "base_batch": rng.choice([32, 64, 256]), "gpus": rng.choice([2, 4, 8, 32]),
                  "per_gpu_batch": rng.choice([16, 32, 64]), "accumulation": rng.randint(1, 4)}
        elif name == "warmup_lr":
            warm = rng.choice([100, 500, 2000])
            kw = {"target_lr": rng.choice([0.004, 0.01, 3e-4]),
                  "step": rng.randint(0, 2 * warm), "warmup_steps": warm}
        elif name == "adam_gb_per_gpu":
            kw = {"params": rng.choice([1.3e9, 7e9, 7.5e9, 13e9, 70e9]),
                  "gpus": rng.choice([2, 8, 16, 64]), "zero_stage": rng.randint(0, 3)}
        elif name == "bubble_share":
            kw = {"stages": rng.randint(2, 16), "microbatches": rng.randint(1, 64)}
        elif name == "ring_bytes":
            kw = {"size_bytes": rng.choice([1e6, 2.5e8, 1.4e10]), "world_size": rng.randint(2, 64)}
        else:
            kw = {"size_bytes": rng.choice([1e6, 2.5e8, 1.4e10]), "world_size": rng.randint(2, 64),
                  "alpha_s": rng.choice([2e-6, 1e-5, 5e-5]),
                  "bandwidth_Bps": rng.choice([1.25e9, 25e9, 450e9])}
        yield kw, KEYS[name](**kw)


def check(name: str, fn: Callable[..., Any], *, hidden: bool = False, seed: int = 0,
          count: int = 25) -> Verdict:
    """Check the student's function for exercise ``name`` (a key of ``KEYS``).

    Visible: the seed's worked examples (expected values shown, as the lesson gave them).
    Hidden: ``count`` randomised variants; a failure names the inputs but not the key.
    """
    if name not in KEYS:
        raise KeyError(f"unknown exercise {name!r}; one of {sorted(KEYS)}")
    cases = (list(_variants(name, seed, count)) if hidden
             else [(kw, KEYS[name](**kw)) for kw in SEED_INPUTS[name]])
    return check_function(name, fn, cases, hint=HINTS[name], reveal=not hidden)
