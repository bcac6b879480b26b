"""labkit.theory.pipeline: bubble fraction, peak activations, stage balance."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    bubble_fraction,
    ideal_pipeline_speedup,
    pipeline_peak_activations,
    pipeline_speedup,
    stage_balance_speedup,
    uneven_bubble_fraction,
)

pytestmark = pytest.mark.lesson03


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_p4_m8_is_3_over_11_of_total_and_3_over_8_of_ideal(schedule: str) -> None:
    """GPipe and 1F1B share the bubble (p-1)/(m+p-1) of total time, (p-1)/m of ideal."""
    assert bubble_fraction(4, 8, schedule) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, schedule, relative_to="ideal") == pytest.approx(3 / 8)


def test_interleaving_divides_the_bubble_by_v() -> None:
    """Narayanan et al. 2021: v chunks per rank give (p-1)/(v*m) relative to ideal."""
    assert bubble_fraction(4, 8, "interleaved", virtual=2) == pytest.approx(3 / 19)
    assert bubble_fraction(4, 8, "interleaved", virtual=2, relative_to="ideal") == \
        pytest.approx(3 / 16)
    assert bubble_fraction(4, 8, "interleaved") == bubble_fraction(4, 8, "1f1b")


def test_bubble_shrinks_with_microbatches_and_vanishes_for_one_stage() -> None:
    """More microbatches shrink the bubble; a single stage never idles."""
    shares = [bubble_fraction(4, m) for m in (1, 4, 16, 64)]
    assert shares == sorted(shares, reverse=True)
    assert bubble_fraction(4, 1) == pytest.approx(0.75)  # seed 003: 3/4 idle with 4 naive stages
    assert bubble_fraction(1, 8) == 0.0


def test_gpipe_holds_every_microbatch_and_1f1b_at_most_p_minus_stage() -> None:
    """Peak in-flight microbatches: GPipe m on every stage; 1F1B min(p - stage, m)."""
    assert [pipeline_peak_activations(4, 8, "gpipe", s) for s in range(4)] == [8, 8, 8, 8]
    assert [pipeline_peak_activations(4, 8, "1f1b", s) for s in range(4)] == [4, 3, 2, 1]
    assert pipeline_peak_activations(4, 2, "1f1b", 0) == 2


def test_ideal_speedup_of_balanced_stages() -> None:
    """p*m/(m+p-1): 4 stages, 16 microbatches give ~3.4x, the seed's balanced result."""
    assert ideal_pipeline_speedup(4, 16) == pytest.approx(64 / 19)
    assert round(ideal_pipeline_speedup(4, 16), 1) == 3.4


def test_slowest_stage_caps_the_pipeline() -> None:
    """sum/max: four equal stages give 4x, one stage five times slower gives 1.6x."""
    assert stage_balance_speedup([1.0, 1.0, 1.0, 1.0]) == pytest.approx(4.0)
    assert stage_balance_speedup([1, 1, 1, 5]) == pytest.approx(1.6)


def test_pipeline_speedup_balanced_equals_gpipe_and_tends_to_balance_limit() -> None:
    """Balanced stages reproduce p*m/(m+p-1); many microbatches approach sum/max."""
    assert pipeline_speedup([2.0] * 4, 8) == pytest.approx(ideal_pipeline_speedup(4, 8))
    costs = [0.5, 0.5, 2.5, 0.5]
    assert pipeline_speedup(costs, 10**6) == pytest.approx(stage_balance_speedup(costs), 1e-4)


def test_uneven_bubble_is_gpipes_for_equal_stages_and_grows_with_the_slowest() -> None:
    """Equal stages give GPipe's (p-1)/(m+p-1) whatever their cost; a last stage 1.1x the
    first (lesson 03's classifier and loss) gives 0.222 at m = 4 and 0.143 at m = 8; a
    stage list that is not a list of times is refused, naming it."""
    for p, m in ((2, 4), (4, 8), (3, 1)):
        assert uneven_bubble_fraction([7.0] * p, m) == pytest.approx(bubble_fraction(p, m))
    assert uneven_bubble_fraction([10.0, 11.0], 4) == pytest.approx(1 - 84 / 108)
    assert uneven_bubble_fraction([10.0, 11.0], 8) == pytest.approx(1 - 168 / 196)
    with pytest.raises(ConfigError, match="stage_costs"):
        uneven_bubble_fraction([], 4)


def test_seed_stage_imbalance_story_1_2x_to_3_4x() -> None:
    """Seed 003: an unbalanced split with few microbatches gives ~1.2x on four GPUs;
    balancing the stages and feeding 16 microbatches gives ~3.4x."""
    before = pipeline_speedup([0.5, 0.5, 2.5, 0.5], 2)
    after = pipeline_speedup([1.0, 1.0, 1.0, 1.0], 16)
    assert round(before, 1) == 1.2
    assert round(after, 1) == 3.4


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: bubble_fraction(0, 8), "stages (0)"),
        (lambda: bubble_fraction(4, 0), "microbatches (0)"),
        (lambda: bubble_fraction(4, 8, "zigzag"), "schedule ('zigzag')"),
        (lambda: bubble_fraction(4, 8, relative_to="step"), "relative_to ('step')"),
        (lambda: bubble_fraction(4, 8, "gpipe", virtual=2), "virtual (2)"),
        (lambda: bubble_fraction(4, 8, "interleaved", virtual=0), "virtual (0)"),
        (lambda: pipeline_peak_activations(4, 8, "1f1b", 4), "stage (4)"),
        (lambda: pipeline_peak_activations(4, 8, "interleaved"), "schedule ('interleaved')"),
        (lambda: stage_balance_speedup([]), "stage_costs ([])"),
        (lambda: stage_balance_speedup([1.0, -2.0]), "stage_costs[1] (-2.0)"),
        (lambda: stage_balance_speedup([0.0, 0.0]), "stage_costs ([0.0, 0.0])"),
        (lambda: pipeline_speedup([1.0], 0), "microbatches (0)"),
    ],
)
def test_bad_input_raises_config_error_naming_the_value(call, names: str) -> None:
    """Every bad argument raises ConfigError whose message names the value and an example."""
    with pytest.raises(ConfigError) as info:
        call()
    assert names in str(info.value)
    assert "e.g." in str(info.value)


def test_zero_bubble_is_a_third_of_1f1b_relative_to_ideal_as_qi_et_al_state() -> None:
    """ZB-H1 (Qi et al. 2023, section 2.1): bubble (p-1)(T_F+T_B-T_W) against 1F1B's
    (p-1)(T_F+T_B+T_W); with equal costs the sail-sg table's (p-1)/(3m) of ideal."""
    assert bubble_fraction(4, 8, "zb", relative_to="ideal") == pytest.approx(3 / 24)
    assert bubble_fraction(4, 8, "zb") == pytest.approx(3 / 27)
    # uneven costs: T_F=1, T_B=1, T_W=0.5 -> idle 3 * 1.5 while working 8 * 2.5
    assert bubble_fraction(4, 8, "zb", costs=(1, 1, 0.5)) == pytest.approx(4.5 / 24.5)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 7), (4, 4), (1, 3)])
def test_zero_bubble_formula_matches_labkits_own_zb_plan(p: int, m: int) -> None:
    """The closed form equals the simulated ZB plan (F = I = W = 1), and its peak
    activations the plan's on every rank."""
    from labkit.schedules import build_plan, peak_in_flight, planned_bubble_fraction

    plan = build_plan("zb", p, m)
    assert bubble_fraction(p, m, "zb") == pytest.approx(planned_bubble_fraction(plan))
    assert [pipeline_peak_activations(p, m, "zb", r) for r in range(p)] == \
        [peak_in_flight(plan, r) for r in range(p)]


def test_zero_bubble_costs_are_checked() -> None:
    with pytest.raises(ConfigError, match="T_W <= T_F"):
        bubble_fraction(4, 8, "zb", costs=(1, 1, 3))
    with pytest.raises(ConfigError, match="three times"):
        bubble_fraction(4, 8, "zb", costs=(1, 1))
    with pytest.raises(ConfigError, match=r"microbatches \(2\) must be >= stages \(4\)"):
        bubble_fraction(4, 2, "zb")
