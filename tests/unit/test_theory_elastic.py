"""labkit.theory.batch's elastic resize: the LR follows the global batch when ranks leave or
join (seed 002's ElasticTrainer), or stays when accumulation keeps the global batch."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import accumulation_after_resize, global_batch, lr_after_resize, scaled_lr

pytestmark = pytest.mark.lesson02


def test_shrinking_halves_the_global_batch_and_the_linear_lr() -> None:
    """4 ranks x 16 at 0.8 (0.2 at 16, linear) -> 2 ranks x 16: global batch 32, LR 0.4 --
    the LR the rule gives the new global batch from the original base."""
    assert lr_after_resize(0.8, 4, 2) == pytest.approx(0.4)
    assert lr_after_resize(0.8, 4, 2) == pytest.approx(scaled_lr(0.2, 16, global_batch(16, 2)))
    assert lr_after_resize(0.4, 2, 8) == pytest.approx(1.6)


def test_sqrt_rule_follows_the_square_root() -> None:
    """Under the sqrt rule halving the ranks divides the LR by sqrt(2)."""
    assert lr_after_resize(0.8, 4, 2, rule="sqrt") == pytest.approx(0.8 / 2 ** 0.5)


def test_keeping_the_global_batch_keeps_the_lr() -> None:
    """Accumulation makes up the lost ranks' samples: 4 x 1 -> 2 x 2; the LR is unchanged."""
    assert accumulation_after_resize(1, 4, 2) == 2
    assert accumulation_after_resize(2, 2, 4) == 1
    assert lr_after_resize(0.8, 4, 2, keep_global_batch=True) == 0.8
    assert global_batch(16, 4, 1) == global_batch(16, 2, accumulation_after_resize(1, 4, 2))


def test_a_global_batch_that_cannot_be_kept_is_refused() -> None:
    """4 ranks x 1 cannot become 3 ranks with a whole accumulation count."""
    with pytest.raises(ConfigError, match=r"not a multiple of new_devices \(3\)"):
        accumulation_after_resize(1, 4, 3)
    with pytest.raises(ConfigError, match="new_devices"):
        lr_after_resize(0.8, 4, 3, keep_global_batch=True)
    with pytest.raises(ConfigError, match="new_devices"):
        lr_after_resize(0.8, 4, 0)
