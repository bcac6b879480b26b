"""Batch size and learning rate when training is spread over many devices.

Teaches: the global (effective) batch is per-device batch x devices x accumulation steps;
a bigger batch averages away gradient noise, so the learning rate is raised with it (the
linear scaling rule of Goyal et al. 2017, "Accurate, Large Minibatch SGD", or the more
cautious square-root rule), and a warmup ramps up to that rate so the first, noisiest steps
do not blow the model apart.

Worked example (seed lesson, exercise 1): 8 GPUs x 32 per GPU x 4 accumulation steps =
1024; base LR 0.001 at batch 256 scales linearly to 0.004; a 500-step linear warmup gives
0.002 at step 250.

This module also holds the small input checks the other ``labkit.theory`` modules share,
so that every calculator rejects bad input with the same kind of message.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence

from labkit.base.errors import ConfigError

LR_RULES = ("linear", "sqrt")
DECAYS = ("none", "linear", "cosine")


# --- shared input checks (used by every theory module) -----------------------------------

def check_int(name: str, value: object, minimum: int, example: str) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum`` (numpy ints are fine)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(
            f"{name} ({value!r}) must be an integer >= {minimum}; e.g. {example}")
    return int(value)


def check_number(name: str, value: object, example: str, *, minimum: float = 0.0,
                 allow_equal: bool = True) -> float:
    """Return ``value`` as float if finite and >= ``minimum`` (> when not ``allow_equal``)."""
    rule = ">=" if allow_equal else ">"
    problem = ConfigError(
        f"{name} ({value!r}) must be a finite number {rule} {minimum:g}; e.g. {example}")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise problem
    number = float(value)
    in_range = number >= minimum if allow_equal else number > minimum
    if not (math.isfinite(number) and in_range):
        raise problem
    return number


def check_choice(name: str, value: object, choices: Sequence[str], example: str) -> str:
    """Return ``value`` if it is one of ``choices``; else raise ConfigError listing them."""
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"{name} ({value!r}) must be one of {options}; e.g. {example}")
    return value


# --- batch size and learning-rate scaling ---------------------------------------------------

def global_batch(per_device_batch: int, devices: int, accumulation: int = 1) -> int:
    """Samples consumed by one optimizer step: ``per_device_batch * devices * accumulation``.

    ``per_device_batch`` is the micro-batch one device runs per forward/backward pass;
    ``accumulation`` is how many such passes are summed before the optimizer steps.
    Example: ``global_batch(32, 8, 4) == 1024``.
    """
    return (check_int("per_device_batch", per_device_batch, 1, "per_device_batch=32")
            * check_int("devices", devices, 1, "devices=8")
            * check_int("accumulation", accumulation, 1, "accumulation=4"))


def scaled_lr(base_lr: float, base_batch: int, new_batch: int, rule: str = "linear") -> float:
    """Learning rate for ``new_batch`` given one tuned at ``base_batch`` (both in samples).

    ``rule="linear"``: ``base_lr * new_batch / base_batch`` (Goyal et al. 2017); the seed's
    0.001 at 256 becomes 0.004 at 1024. ``rule="sqrt"``: ``base_lr * sqrt(new/base)``, the
    gentler rule often used with Adam-style optimizers (0.001 -> 0.002 for the same jump).
    """
    check_number("base_lr", base_lr, "base_lr=0.001")
    check_int("base_batch", base_batch, 1, "base_batch=256")
    check_int("new_batch", new_batch, 1, "new_batch=1024")
    check_choice("rule", rule, LR_RULES, "rule='linear'")
    ratio = new_batch / base_batch
    return base_lr * ratio if rule == "linear" else base_lr * math.sqrt(ratio)


def warmup_lr(target_lr: float, step: int, warmup_steps: int) -> float:
    """Linear warmup from 0 to ``target_lr``: ``target_lr * min(1, step / warmup_steps)``.

    ``step`` counts optimizer steps from 0 (so step 0 has LR 0 when warming up);
    ``warmup_steps=0`` means no warmup: ``target_lr`` from the first step.
    Example: ``warmup_lr(0.004, 250, 500) == 0.002``.
    """
    check_number("target_lr", target_lr, "target_lr=0.004")
    check_int("step", step, 0, "step=250")
    check_int("warmup_steps", warmup_steps, 0, "warmup_steps=500")
    if warmup_steps == 0:
        return float(target_lr)
    return target_lr * min(1.0, step / warmup_steps)


def lr_at_step(step: int, *, target_lr: float, warmup_steps: int = 0,
               total_steps: int | None = None, decay: str = "none",
               min_lr: float = 0.0) -> float:
    """Learning rate at optimizer step ``step`` (counted from 0): linear warmup, then decay.

    Phases:
      1. ``step < warmup_steps``: linear ramp ``target_lr * step / warmup_steps``.
      2. after warmup, ``decay="none"`` holds ``target_lr``; ``"linear"`` and ``"cosine"``
         go from ``target_lr`` at ``warmup_steps`` down to ``min_lr`` at ``total_steps``
         (cosine: ``min + (target - min) * (1 + cos(pi * progress)) / 2``).
      3. ``step >= total_steps`` stays at ``min_lr``.
    ``total_steps`` is required for the decaying schedules and must exceed ``warmup_steps``.
    """
    check_int("step", step, 0, "step=250")
    check_number("target_lr", target_lr, "target_lr=0.004")
    check_int("warmup_steps", warmup_steps, 0, "warmup_steps=500")
    check_choice("decay", decay, DECAYS, "decay='cosine'")
    check_number("min_lr", min_lr, "min_lr=0.0")
    if min_lr > target_lr:
        raise ConfigError(
            f"min_lr ({min_lr:g}) must not exceed target_lr ({target_lr:g}); e.g. min_lr=0.0")
    if decay != "none":
        if total_steps is None:
            raise ConfigError(
                f"total_steps (None) is required for decay={decay!r}; e.g. total_steps=10000")
        check_int("total_steps", total_steps, 1, "total_steps=10000")
        if total_steps <= warmup_steps:
            raise ConfigError(
                f"total_steps ({total_steps}) must be greater than warmup_steps "
                f"({warmup_steps}) for decay={decay!r}; e.g. total_steps={warmup_steps + 1000}")
    elif total_steps is not None:
        check_int("total_steps", total_steps, 1, "total_steps=10000")

    # 1. warmup
    if step < warmup_steps:
        return target_lr * step / warmup_steps
    if decay == "none" or total_steps is None:
        return float(target_lr)
    # 2./3. decay, clamped to min_lr after total_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    if decay == "linear":
        return target_lr - (target_lr - min_lr) * progress
    return min_lr + (target_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_schedule(steps: int | Iterable[int], *, target_lr: float, warmup_steps: int = 0,
                total_steps: int | None = None, decay: str = "none",
                min_lr: float = 0.0) -> list[float]:
    """``lr_at_step`` for many steps: ``steps`` is a count (steps 0..steps-1) or an iterable.

    Example: ``lr_schedule(1000, target_lr=0.004, warmup_steps=500)`` for a plot.
    """
    if isinstance(steps, int) and not isinstance(steps, bool):
        check_int("steps", steps, 0, "steps=1000")
        step_list: Iterable[int] = range(steps)
    elif isinstance(steps, Iterable) and not isinstance(steps, (str, bytes)):
        step_list = steps
    else:
        raise ConfigError(
            f"steps ({steps!r}) must be a step count or an iterable of steps; e.g. steps=1000")
    return [lr_at_step(s, target_lr=target_lr, warmup_steps=warmup_steps,
                       total_steps=total_steps, decay=decay, min_lr=min_lr)
            for s in step_list]


def lars_local_lr(lr: float, weight_norm: float, grad_norm: float, *, eta: float = 0.001,
                  weight_decay: float = 0.0) -> float:
    """The step size LARS gives one layer: ``lr x eta x ||w|| / (||g|| + wd x ||w||)``.

    You, Gitman and Ginsburg 2017 ("Large Batch Training of Convolutional Networks"): each
    layer's update is scaled to a fixed share (``eta``) of its own weight norm, so no layer
    moves too far when the global LR is large. ``labkit.train.optim.LARS`` computes the same
    ratio on tensors; LAMB (You et al. 2019) applies it to Adam's update instead of ``g``.
    """
    rate = check_number("lr", lr, "lr=0.1", allow_equal=False)
    w = check_number("weight_norm", weight_norm, "weight_norm=3.0")
    g = check_number("grad_norm", grad_norm, "grad_norm=0.5")
    e = check_number("eta", eta, "eta=0.001", allow_equal=False)
    wd = check_number("weight_decay", weight_decay, "weight_decay=0.0")
    if g + wd * w == 0:
        raise ConfigError("grad_norm + weight_decay x weight_norm is 0: LARS's ratio is "
                          "undefined; e.g. grad_norm=0.5")
    return rate * e * w / (g + wd * w)


def lr_after_resize(lr: float, old_devices: int, new_devices: int, *,
                    rule: str = "linear", keep_global_batch: bool = False) -> float:
    """The LR after an elastic resize from ``old_devices`` to ``new_devices`` data-parallel ranks.

    Seed 002's ``ElasticTrainer`` re-wraps the model when workers leave or join and then
    "adjusts the learning rate for the new world size". With the per-device batch kept, the
    global batch changes by ``new / old`` and the LR follows the same rule that set it
    (``scaled_lr``): 0.8 on 4 ranks becomes 0.4 on 2 (linear) or 0.566 (sqrt). With
    ``keep_global_batch=True`` the lost ranks' share is made up by accumulation
    (``accumulation_after_resize``), the global batch is unchanged, and so is the LR.
    """
    old = check_int("old_devices", old_devices, 1, "old_devices=4")
    new = check_int("new_devices", new_devices, 1, "new_devices=2")
    if keep_global_batch:
        check_number("lr", lr, "lr=0.8")
        accumulation_after_resize(1, old, new)  # raises when the batch cannot be kept
        return float(lr)
    return scaled_lr(lr, old, new, rule=rule)


def accumulation_after_resize(accumulation: int, old_devices: int, new_devices: int) -> int:
    """Accumulation steps that keep the global batch when ranks leave or join:
    ``accumulation x old / new`` (4 ranks x 1 -> 2 ranks x 2). Raises when that is not a
    whole number (the global batch cannot be kept exactly)."""
    acc = check_int("accumulation", accumulation, 1, "accumulation=1")
    old = check_int("old_devices", old_devices, 1, "old_devices=4")
    new = check_int("new_devices", new_devices, 1, "new_devices=2")
    if (acc * old) % new:
        raise ConfigError(f"accumulation ({acc}) x old_devices ({old}) = {acc * old} is not a "
                          f"multiple of new_devices ({new}): the global batch cannot be kept; "
                          f"e.g. old_devices=4, new_devices=2")
    return acc * old // new
