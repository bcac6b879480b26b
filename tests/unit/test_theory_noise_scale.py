"""labkit.theory.noise_scale against McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training": B_simple = tr(Sigma)/|G|^2 (eq. 2.9), the Appendix A.1 estimators,
eps_opt = eps_max / (1 + B_noise/B) (eq. 2.6) and the steps/examples trade-off (eq. 2.11)."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    examples_needed,
    optimal_lr,
    simple_noise_scale,
    steps_needed,
    trace_sigma,
    true_grad_sq,
)

pytestmark = pytest.mark.lesson02


def _population(seed: int = 0, examples: int = 200, dim: int = 7) -> tuple[np.ndarray, float, float]:
    """Per-example gradients, the true gradient's |G|^2 and tr(Sigma), from their definitions."""
    rng = np.random.default_rng(seed)
    per_example = rng.normal(0.3, 1.5, size=(examples, dim))
    g = per_example.mean(axis=0)
    sigma = np.cov(per_example, rowvar=False, bias=True)  # the population covariance
    return per_example, float(g @ g), float(np.trace(sigma))


def test_estimators_recover_g_and_trace_from_exact_expectations() -> None:
    """E|G_B|^2 = |G|^2 + tr(Sigma)/B (A.1): fed the exact expectations at two batch sizes,
    the estimators return |G|^2 and tr(Sigma) of the definitions, and B_simple their ratio."""
    _, g_sq, tr = _population()
    small, big = 8, 64
    e_small, e_big = g_sq + tr / small, g_sq + tr / big
    assert true_grad_sq(small, e_small, big, e_big) == pytest.approx(g_sq, rel=1e-12)
    assert trace_sigma(small, e_small, big, e_big) == pytest.approx(tr, rel=1e-12)
    assert simple_noise_scale(tr, g_sq) == pytest.approx(tr / g_sq)


def test_estimators_are_unbiased_over_sampled_batches() -> None:
    """Sampled minibatches (with replacement, as the paper assumes): averaged over many
    steps, the two estimates land on the definitions (within Monte-Carlo error)."""
    per_example, g_sq, tr = _population(seed=1)
    rng = np.random.default_rng(2)
    small, big, trials = 4, 16, 20000
    gs, ts = [], []
    for _ in range(trials):
        idx = rng.integers(0, len(per_example), size=big)
        g_big = per_example[idx].mean(axis=0)
        g_small = per_example[idx[:small]].mean(axis=0)  # one "rank's" share of the big batch
        gs.append(true_grad_sq(small, float(g_small @ g_small), big, float(g_big @ g_big)))
        ts.append(trace_sigma(small, float(g_small @ g_small), big, float(g_big @ g_big)))
    assert np.mean(ts) == pytest.approx(tr, rel=0.03)
    assert np.mean(gs) == pytest.approx(g_sq, rel=0.1)
    assert simple_noise_scale(float(np.mean(ts)), float(np.mean(gs))) == pytest.approx(
        tr / g_sq, rel=0.12)


def test_optimal_lr_is_linear_for_small_batches_and_saturates() -> None:
    """eq. 2.6: linear in B while B << B_noise (the linear scaling rule), half of eps_max at
    B = B_noise, within 1% of eps_max at 100 x B_noise."""
    assert optimal_lr(10, 1.0, 1000) == pytest.approx(10 / 1010)
    assert optimal_lr(20, 1.0, 1000) / optimal_lr(10, 1.0, 1000) == pytest.approx(2.0, rel=0.01)
    assert optimal_lr(1000, 2.0, 1000) == pytest.approx(1.0)
    assert optimal_lr(100_000, 1.0, 1000) > 0.99


def test_steps_examples_tradeoff_is_the_papers_hyperbola() -> None:
    """eq. 2.11: (S/S_min - 1)(E/E_min - 1) = 1 at every batch; at B = B_crit = B_noise both
    cost 2x their minimum; E_min / S_min = B_noise."""
    for batch in (16, 100, 512, 4096):
        s, e = steps_needed(batch, 512), examples_needed(batch, 512)
        assert (s - 1) * (e - 1) == pytest.approx(1.0)
    assert steps_needed(512, 512) == pytest.approx(2.0)
    assert examples_needed(512, 512) == pytest.approx(2.0)
    s_min, e_min = 1000.0, 512_000.0  # E_min / S_min = B_crit = 512
    assert examples_needed(512, 512, e_min) / steps_needed(512, 512, s_min) == pytest.approx(512)


def test_bad_input_names_the_value_and_the_rule() -> None:
    """b_big must exceed b_small; batches and |G|^2 must be positive."""
    with pytest.raises(ConfigError, match=r"b_big \(8\) must exceed b_small \(8\)"):
        true_grad_sq(8, 1.0, 8, 0.5)
    with pytest.raises(ConfigError, match="grad_sq"):
        simple_noise_scale(1.0, 0.0)
    with pytest.raises(ConfigError, match="batch"):
        steps_needed(0, 100)
