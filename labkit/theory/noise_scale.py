"""The gradient noise scale: how large a batch is still worth its samples.

Teaches: a minibatch gradient is the true gradient ``G`` plus noise whose covariance shrinks
as ``1/B``. While ``B`` is small, doubling it halves the noise and lets the LR double (the
linear scaling rule); once ``B`` is well past the noise scale the gradient is already
nearly exact, a bigger batch only repeats it, and the LR cannot grow further.

Follows McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch
Training" (arXiv:1812.06162):

* the *simple noise scale* ``B_simple = tr(Sigma) / |G|^2`` (their eq. 2.9), with ``Sigma``
  the per-example gradient covariance; it approximates ``B_noise`` and the critical batch;
* ``E[|G_B|^2] = |G|^2 + tr(Sigma) / B`` for a batch of ``B`` examples, so gradient norms
  measured at two batch sizes give unbiased estimates of both terms (their Appendix A.1):
  ``|G|^2 ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)`` and
  ``S ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)``.
  Data parallelism measures both at no cost: a rank's local gradient is the small batch,
  the all-reduced one the big batch;
* the optimal SGD step ``eps_opt(B) = eps_max / (1 + B_noise / B)`` (eq. 2.6): linear in
  ``B`` while ``B << B_noise``, flat beyond -- where linear LR scaling stops;
* the steps / examples trade-off ``S = S_min (1 + B_noise / B)``,
  ``E = E_min (1 + B / B_noise)`` (eq. 2.11 with ``B_crit = E_min / S_min``).
"""

from __future__ import annotations

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_number


def _batches(b_small: float, b_big: float) -> tuple[float, float]:
    small = check_number("b_small", b_small, "b_small=32", allow_equal=False)
    big = check_number("b_big", b_big, "b_big=64", allow_equal=False)
    if big <= small:
        raise ConfigError(f"b_big ({b_big!r}) must exceed b_small ({b_small!r}); "
                          f"e.g. b_small=32 (one rank), b_big=64 (two ranks all-reduced)")
    return small, big


def true_grad_sq(b_small: float, g_small_sq: float, b_big: float, g_big_sq: float) -> float:
    """Unbiased estimate of ``|G|^2`` from squared gradient norms at two batch sizes
    (McCandlish et al. 2018, A.1): ``(B_big |G_big|^2 - B_small |G_small|^2) / (B_big -
    B_small)``. One step's estimate is noisy and may be negative: average many."""
    small, big = _batches(b_small, b_big)
    gs = check_number("g_small_sq", g_small_sq, "g_small_sq=0.5")
    gb = check_number("g_big_sq", g_big_sq, "g_big_sq=0.3")
    return (big * gb - small * gs) / (big - small)


def trace_sigma(b_small: float, g_small_sq: float, b_big: float, g_big_sq: float) -> float:
    """Unbiased estimate of ``tr(Sigma)`` (the paper's ``S``), the per-example gradient
    variance summed over parameters: ``(|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)``."""
    small, big = _batches(b_small, b_big)
    gs = check_number("g_small_sq", g_small_sq, "g_small_sq=0.5")
    gb = check_number("g_big_sq", g_big_sq, "g_big_sq=0.3")
    return (gs - gb) / (1.0 / small - 1.0 / big)


def simple_noise_scale(trace: float, grad_sq: float) -> float:
    """``B_simple = tr(Sigma) / |G|^2`` (eq. 2.9), in examples. Pass averages of the two
    estimates over many steps (the paper averages numerator and denominator apart)."""
    t = check_number("trace", trace, "trace=12.0")
    g = check_number("grad_sq", grad_sq, "grad_sq=0.1", allow_equal=False)
    return t / g


def optimal_lr(batch: float, lr_max: float, b_noise: float) -> float:
    """The best SGD learning rate at ``batch`` (eq. 2.6): ``lr_max / (1 + B_noise / B)``.

    ``lr_max`` is the best LR with the exact gradient. For ``B << B_noise`` this is
    ``lr_max x B / B_noise``, the linear scaling rule; at ``B = B_noise`` it is half of
    ``lr_max``; beyond, a bigger batch barely raises it.
    """
    b = check_number("batch", batch, "batch=256", allow_equal=False)
    top = check_number("lr_max", lr_max, "lr_max=1.0", allow_equal=False)
    n = check_number("b_noise", b_noise, "b_noise=500", allow_equal=False)
    return top / (1.0 + n / b)


def steps_needed(batch: float, b_noise: float, min_steps: float = 1.0) -> float:
    """Optimizer steps to reach a given loss at ``batch``: ``S_min (1 + B_noise / B)``;
    with the default ``min_steps=1`` it is the ratio ``S / S_min``."""
    b = check_number("batch", batch, "batch=256", allow_equal=False)
    n = check_number("b_noise", b_noise, "b_noise=500", allow_equal=False)
    return check_number("min_steps", min_steps, "min_steps=1000", allow_equal=False) * (1 + n / b)


def examples_needed(batch: float, b_noise: float, min_examples: float = 1.0) -> float:
    """Training examples to reach the same loss: ``E_min (1 + B / B_noise)``; with the
    default ``min_examples=1`` it is the ratio ``E / E_min``."""
    b = check_number("batch", batch, "batch=256", allow_equal=False)
    n = check_number("b_noise", b_noise, "b_noise=500", allow_equal=False)
    return check_number("min_examples", min_examples, "min_examples=1e6",
                        allow_equal=False) * (1 + b / n)
