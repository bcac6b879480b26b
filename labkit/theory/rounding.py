"""How far float rounding alone moves weights: the lab's one tolerance for "equals one process".

Data parallelism, ZeRO, a pipeline or a parameter server compute the same sums as one process
on the global batch, in another order. fp32 addition is not associative: each sum is off by
about ``2**-24`` (6e-8) of its largest term, so the ranks and the one process end a step with
gradients a few ulps apart, and the optimizer carries that into the weights:

* **SGD, momentum, LARS** update linearly in the gradient: the weights drift apart by about
  lr x (the gradient's rounding) per step, which stays near 1e-8 (measured here, 2 DDP ranks,
  lr 0.05: 1.5e-8 after 10 and 40 steps with SGD, 3e-8 with momentum and LARS) and grows with
  the learning rate, the steps and the length of the sums (lesson 11's server, lr 0.4, 40
  steps of 2 x 4096 samples: 1.6e-5).
* **Adam and LAMB** divide each coordinate by its own running RMS. Where a coordinate's
  gradient nearly cancels over the batch (large terms, tiny sum), its rounding is a large
  share of it, and the normalised update -- up to about lr per step -- can differ by a visible
  fraction of lr: 7e-5 after 10 steps and 1.5e-4 after 40 for Adam at lr 0.05 (7.6e-6 for
  LAMB), although nothing is wrong.

So the tolerance is per optimizer family, proportional to ``lr x steps``: ``PER_LR_STEP`` x
lr x steps, never below ``FLOOR``. It leaves 10-300x room over the measurements above and
still catches a real mistake: a gradient not averaged, or one rank's shard lost, moves an
SGD run by about lr x |g| per step (1e-3 and more).

The Adam bar holds for the orders of summation measured above (the lab's ranks on CPU
kernels), not for every order. On the lab's GPT, one process with the rows of every batch
reversed (the same samples, the same sums in another order) ends 1.9e-3 from the unreversed
run after 5 Adam steps at lr 0.01 -- 33 of one layer's 65,536 weights over 1e-4 -- and 7.5e-9
with SGD; on an H200, ZeRO's GPT ended 2.6e-3 from the CPU reference the same way
(docs/benchmarks.md). Where another device's kernels sum in another order, compare with SGD.
"""

from __future__ import annotations

from typing import Any

PER_LR_STEP = {"sgd": 1e-5, "momentum": 1e-5, "lars": 1e-5, "adam": 1e-3, "lamb": 1e-3}
"""Rounding's reach per unit of lr x steps, by optimizer (see the module's measurements)."""
FLOOR = 1e-6
"""Never ask for less than this: a few ulps of weights of order one."""


def same_weights_tolerance(optimizer: str, lr: float, steps: int) -> float:
    """The largest |w - one process| that float rounding explains after ``steps`` steps of
    ``optimizer`` at learning rate ``lr`` (fp32); a larger one is a bug, not rounding."""
    if optimizer not in PER_LR_STEP:
        raise ValueError(f"optimizer {optimizer!r} must be one of {', '.join(PER_LR_STEP)}")
    if not lr > 0 or steps < 0:
        raise ValueError(f"lr ({lr}) must be > 0 and steps ({steps}) >= 0")
    return max(FLOOR, PER_LR_STEP[optimizer] * lr * steps)


def run_tolerance(config: Any) -> float:
    """``same_weights_tolerance`` for a run's own settings (anything with ``optimizer``,
    ``lr`` and ``steps``: a ``RunConfig``): what a lesson sets beside its |w - one process|."""
    return same_weights_tolerance(config.optimizer, config.lr, config.steps)


def rounding_text(optimizer: str, lr: float, steps: int) -> str:
    """The words a lesson prints beside |w - one process|: the tolerance and why."""
    tol = same_weights_tolerance(optimizer, lr, steps)
    why = ("Adam-like updates divide by each coordinate's RMS, so rounding can reach a "
           "fraction of lr" if PER_LR_STEP[optimizer] > 1e-4 else
           "a linear update carries only lr x the gradient's rounding")
    return (f"float rounding reaches about {tol:.0e} after {steps} steps of {optimizer} at lr "
            f"{lr:g} ({why})")
