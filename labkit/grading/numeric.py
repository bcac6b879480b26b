"""Problem set 1 (the numbers of distributed training): visible checks and per-part scoring.

What ships here is only what a student may see: the seed lessons' worked examples with
the answers the seeds print (8 GPUs x 32 per GPU x 4 accumulation = 1024; 0.001 at 256 ->
0.004; 0.002 at step 250 of a 500-step warmup; a 3B Adam model on 4 GPUs needs 48 GB per
GPU without ZeRO, 16.5 with ZeRO-2, 12 with ZeRO-3; ...), the parts each question is
scored by, and the hints. The answer keys and the randomised hidden inputs live on the
instructor's side only (``solutions/_grading/ps1_numbers.py``), which autograding loads
outside the student's box; ``tests/unit/test_grading_numeric.py`` pins them to these
printed answers.

A student's function must do the arithmetic itself: a call into ``labkit.theory`` (the
calculators the key is built from) while it runs fails that case, with a message.

Conventions stated to the student in the notebook: GB = 1e9 bytes; mixed-precision Adam
is 16 bytes per parameter (2 weights + 2 grads + 12 optimizer incl. fp32 master);
bubble as a share of the TOTAL step time, ``(p-1)/(m+p-1)``; ring bytes are what each rank
sends, ``2(n-1)/n x size``; ring time is the alpha-beta model ``2(n-1)alpha + bytes/bw``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from labkit.grading import calls
from labkit.grading.checks import NotANumber, as_number, close
from labkit.grading.parts import Question

Case = tuple[dict[str, Any], float]
FORBID = ("labkit.theory", "labkit.grading", "labkit.quiz")

# The seeds' worked examples, with the answers the seeds print (visible tests).
SEED_CASES: dict[str, list[Case]] = {
    "global_batch": [({"gpus": 8, "per_gpu_batch": 32, "accumulation": 4}, 1024),
                     ({"gpus": 8, "per_gpu_batch": 64, "accumulation": 1}, 512)],
    "target_lr": [({"base_lr": 0.001, "base_batch": 256, "gpus": 8, "per_gpu_batch": 32,
                    "accumulation": 4}, 0.004),
                  ({"base_lr": 1e-3, "base_batch": 64, "gpus": 8, "per_gpu_batch": 64,
                    "accumulation": 1}, 8e-3)],
    "warmup_lr": [({"target_lr": 0.004, "step": 250, "warmup_steps": 500}, 0.002),
                  ({"target_lr": 0.004, "step": 900, "warmup_steps": 500}, 0.004)],
    "adam_gb_per_gpu": [({"params": 3e9, "gpus": 4, "zero_stage": 0}, 48.0),
                        ({"params": 3e9, "gpus": 4, "zero_stage": 2}, 16.5),
                        ({"params": 3e9, "gpus": 4, "zero_stage": 3}, 12.0)],
    "bubble_share": [({"stages": 4, "microbatches": 8}, 3 / 11)],
    "ring_bytes": [({"size_bytes": 4e9, "world_size": 8}, 7e9)],
    "ring_time": [({"size_bytes": 4e9, "world_size": 8, "alpha_s": 5e-6,
                    "bandwidth_Bps": 25e9}, 14 * 5e-6 + 7e9 / 25e9)],
}

# Each question's parts: (label, which cases belong to it).
PARTS: dict[str, list[tuple[str, Callable[..., bool]]]] = {
    "global_batch": [("one micro-batch per step", lambda accumulation, **_: accumulation == 1),
                     ("with gradient accumulation", lambda accumulation, **_: accumulation > 1)],
    "target_lr": [("one micro-batch per step", lambda accumulation, **_: accumulation == 1),
                  ("with gradient accumulation", lambda accumulation, **_: accumulation > 1)],
    "warmup_lr": [("during warmup", lambda step, warmup_steps, **_: step < warmup_steps),
                  ("after warmup", lambda step, warmup_steps, **_: step >= warmup_steps)],
    "adam_gb_per_gpu": [("ZeRO-0 (nothing sharded)", lambda zero_stage, **_: zero_stage == 0),
                        ("ZeRO-1 and ZeRO-2", lambda zero_stage, **_: zero_stage in (1, 2)),
                        ("ZeRO-3", lambda zero_stage, **_: zero_stage == 3)],
    "bubble_share": [("at least as many microbatches as stages",
                      lambda stages, microbatches, **_: microbatches >= stages),
                     ("fewer microbatches than stages",
                      lambda stages, microbatches, **_: microbatches < stages)],
    "ring_bytes": [("bytes per rank", lambda **_: True)],
    "ring_time": [("latency-bound (small messages)", lambda size_bytes, **_: size_bytes < 1e7),
                  ("bandwidth-bound (large messages)", lambda size_bytes, **_: size_bytes >= 1e7)],
}

POINTS = {"global_batch": 2, "target_lr": 2, "warmup_lr": 2, "adam_gb_per_gpu": 3,
          "bubble_share": 2, "ring_bytes": 1, "ring_time": 2}

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


class NumericQuestion(Question):
    """A ps1 question: the student's function checked case by case, each case in a part."""

    def __init__(self, name: str, fn: Callable[..., Any], points: float | None = None):
        if name not in PARTS:
            raise KeyError(f"unknown exercise {name!r}; one of {sorted(PARTS)}")
        super().__init__(name, POINTS[name] if points is None else points,
                         [label for label, _ in PARTS[name]])
        self.fn = fn
        self.check(SEED_CASES[name], reveal=True)

    def _label(self, kwargs: dict[str, Any]) -> str:
        return next(label for label, rule in PARTS[self.name] if rule(**kwargs))

    def check(self, cases: Iterable[Case], *, reveal: bool = False) -> None:
        """Run the function on every case; ``reveal`` shows expected values in feedback."""
        hint = HINTS[self.name]
        for kwargs, expected in cases:
            label = self._label(kwargs)
            where = f"{self.name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            got = calls.answer(self, label, self.fn, (), kwargs, forbid=FORBID, where=where,
                               reader=_plain_number, hint=hint)
            if got is None:
                continue
            ok = close(got, float(expected), 1e-6)
            shown = f", expected {float(expected):g}" if reveal else ""
            self.record(label, ok, f"{where}: got {got:g}{shown}. Try: {hint}")


def _plain_number(value: Any) -> float | str:
    try:
        return as_number(value)
    except NotANumber as exc:
        return f"{exc}. Return a plain int or float"


def question(name: str, fn: Callable[..., Any], points: float | None = None) -> NumericQuestion:
    """The question for exercise ``name``, already checked on the seed's worked examples."""
    return NumericQuestion(name, fn, points)


class ValueQuestion(Question):
    """A question answered by one number (a variable, not a function)."""

    def __init__(self, name: str, value: Any, points: float, unit: str = ""):
        super().__init__(name, points, ["the right value"])
        self.unit = unit
        try:
            self.got: float | None = as_number(value, name)
            self.record("a plain number", True, gate=True)
        except NotANumber as exc:
            self.got = None
            self.record("a plain number", False, f"{exc}. Set {name} to a plain number.",
                        gate=True)

    def expect(self, expected: float, hint: str = "", rel: float = 1e-6) -> None:
        """Compare with the key (hidden tests: the key is never shown)."""
        if self.got is not None:
            self.record("the right value", close(self.got, float(expected), rel),
                        f"{self.name} = {self.got:g}{self.unit} is not right. Try: {hint}")


def value_question(name: str, value: Any, points: float, unit: str = "") -> ValueQuestion:
    """A one-number question: checked as a number here, against the key at grading."""
    return ValueQuestion(name, value, points, unit)
