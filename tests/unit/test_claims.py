"""Timed claims judged from their numbers (``labkit.analysis.claims``, issue 32): every case
the issue found in the lessons, on synthetic numbers, and the rules the verdict keeps."""

from __future__ import annotations

import math

import pytest

from labkit.analysis.claims import (
    CONTRADICTED,
    HOLDS,
    INCONCLUSIVE,
    Claim,
    Sample,
    judge,
)

pytestmark = pytest.mark.lesson00


def test_a_sample_is_its_statistic_and_half_its_spread():
    s = Sample.of([0.256, 0.238, 0.254], "min")
    assert s.value == 0.238 and s.noise == pytest.approx(0.009)
    m = Sample.of([3.0, 1.0, 2.0])
    assert m.value == 2.0 and m.noise == 1.0 and m.relative_noise == 0.5
    r = Sample.ratio([110, 100, 120], [100, 100, 100])
    assert r.value == pytest.approx(1.1) and r.noise == pytest.approx(0.1)
    assert math.isnan(Sample.of([5.0]).noise)
    with pytest.raises(ValueError, match="at least one number"):
        Sample.of([])
    with pytest.raises(ValueError, match="pairs"):
        Sample.ratio([1.0], [1.0, 2.0])


# ---- the cases the issue found in the lessons --------------------------------------------
def test_lesson01_a_step_nine_times_under_its_prediction_is_contradicted():
    """ "2 ranks: measured 27.8 ms, predicted 248.5 ms" beside "the step grows by the exposed
    all-reduce"."""
    v = judge(Sample.of([27.8, 29.0, 31.5], "min"),
              Claim.within_factor(248.5, 1.5, "the step grows by the exposed all-reduce"),
              "2-rank step (ms)")
    assert v.word == CONTRADICTED and "27.8" in v.sentence()


def test_lesson01_an_efficiency_above_one_is_contradicted():
    """A weak-scaling efficiency of 8.5 (and lesson 10's 140 %) cannot be: efficiency <= 1."""
    for runs in ([8.5, 8.1, 8.9], [1.40, 1.38, 1.45]):
        v = judge(Sample.of(runs), Claim(0.0, 1.0, "weak scaling never beats one rank"),
                  "efficiency")
        assert v.word == CONTRADICTED


def test_lesson01_amdahl_fits_that_flip_between_runs_are_inconclusive():
    """f = 0.000 in one run, 0.798 in the other: the fit carries its own noise."""
    f_for_6x_on_8 = (8 / 6 - 1) / 7
    v = judge(Sample.of([0.0, 0.798]), Claim.near(f_for_6x_on_8, 0.05, "Amdahl's f"), "f")
    assert v.word == INCONCLUSIVE and "inconclusive on this machine (noise +-100%)" in v.sentence()


def test_lesson01_a_bucket_that_wins_once_and_loses_once_is_inconclusive():
    v = judge(Sample.ratio([95, 108], [100, 100]), Claim.above(1.0, "bucketing overlaps"),
              "naive / bucketed step")
    assert v.word == INCONCLUSIVE


def test_lesson03_a_bubble_far_from_the_formula_never_holds_even_when_it_shrinks():
    """Measured 0.32 -> 0.30 for m = 4 -> 8, predicted 0.20 -> 0.11: "the rule holds here"
    was printed because 0.30 < 0.32."""
    m8 = judge(Sample.of([0.30, 0.31, 0.305], "min"),
               Claim.near(1 / 9, 0.05, "the bubble is (p-1)/(m+p-1)"), "bubble at m = 8")
    assert m8.word == CONTRADICTED
    shrink = judge(Sample.of([0.02, 0.01, 0.03]),
                   Claim.near(0.2 - 1 / 9, 0.05, "8 microbatches shrink the bubble by 0.089"),
                   "m=4 minus m=8")
    assert shrink.word != HOLDS


def test_lesson03_zero_bubble_slower_than_1f1b_is_contradicted():
    """ "the W's filled bubbles, as planned" while ZB's step was 195 ms against 1F1B's 180."""
    v = judge(Sample.ratio([180, 181, 179], [195, 197, 194]),
              Claim.above(1.0, "splitting B into I and W shortens the step"), "1F1B / ZB step")
    assert v.word == CONTRADICTED


def test_lesson10_a_slower_wire_that_shortens_the_step_is_contradicted():
    v = judge(Sample.ratio([80.3, 79.0, 81.5], [100, 100, 100]),
              Claim.above(1.0, "a slower wire never makes a step shorter"), "slow / fast step")
    assert v.word == CONTRADICTED


def test_lesson12_steps_eight_times_apart_are_not_about_the_same():
    v = judge(Sample.of([24.0, 23.0, 26.0], "min"),
              Claim.within_factor(3.0, 1.5, "the steps cost about the same under both "
                                  "launchers"), "Ray Train step (ms)")
    assert v.word == CONTRADICTED


def test_lesson09_shares_of_one_step_adding_past_one_are_contradicted():
    """compute_share 1 and comm_share 0.767 for one step."""
    v = judge(Sample.of([1.767, 1.76, 1.77]), Claim.below(1.0, "compute and exposed "
              "communication share one step"), "compute + comm share")
    assert v.word == CONTRADICTED


def test_lesson06_held_out_errors_of_28_to_58_percent_do_not_predict_the_others():
    v = judge(Sample.of([0.28, 0.41, 0.58], "max"),
              Claim.below(0.20, "alpha-beta fitted on four sizes predicts the others"),
              "worst held-out error")
    assert v.word == CONTRADICTED


# ---- the rules --------------------------------------------------------------------------
@pytest.mark.parametrize("runs", [[1.02, 0.97, 1.05], [1.0, 1.0, 1.0], [0.99, 1.03]])
def test_an_effect_inside_its_noise_never_holds(runs):
    assert judge(Sample.of(runs), Claim.above(1.0, "faster"), "ratio").word != HOLDS


def test_the_wrong_sign_never_holds_and_a_clear_effect_does():
    assert judge(Sample.of([0.9, 0.92, 0.91]), Claim.above(1.0, "faster"), "r").word == CONTRADICTED
    ok = judge(Sample.of([1.36, 1.33, 1.40]), Claim.above(1.0, "faster"), "r")
    assert ok.word == HOLDS and ok.sentence().endswith("-- holds")
    assert "1.36 +- 0.035" in ok.sentence() and "above 1" in ok.sentence()


def test_one_run_cannot_hold_but_can_be_far_off():
    one = judge(Sample.of([0.21]), Claim.near(0.2, 0.05, "bubble"), "bubble")
    assert one.word == INCONCLUSIVE and "one run cannot tell" in one.sentence()
    far = judge(Sample.of([0.9]), Claim.near(0.2, 0.05, "bubble"), "bubble")
    assert far.word == CONTRADICTED


def test_a_claim_refuses_a_meaningless_factor():
    with pytest.raises(ValueError, match="factor >= 1"):
        Claim.within_factor(5.0, 0.5, "x")


# ---- the protocol: alternated repeats (labkit.lessons.measure) ---------------------------
def test_variants_run_alternated_with_the_warmup_discarded():
    from types import SimpleNamespace

    from labkit.lessons.measure import alternate, least, ratio

    order, clock = [], iter([9.0, 9.0, 2.0, 1.0, 2.2, 1.1, 1.9, 1.0])

    def variant(name):
        def run():
            order.append(name)
            return SimpleNamespace(step_time_s=next(clock))
        return run

    seen = []
    numbers, results = alternate({"naive": variant("naive"), "bucketed": variant("bucketed")},
                                 repeats=3, warmup=1, on_run=lambda *a: seen.append(a))
    assert order == ["naive", "bucketed"] * 4
    assert numbers == {"naive": [2.0, 2.2, 1.9], "bucketed": [1.0, 1.1, 1.0]}
    assert len(results["naive"]) == 3 and seen[0] == ("naive", -1, 9.0)
    r = ratio(numbers, "naive", "bucketed")
    assert r.value == pytest.approx(2.0) and r.noise == pytest.approx(0.05)
    assert judge(r, Claim.above(1.0, "bucketing overlaps"), "naive / bucketed").word == HOLDS
    assert least(numbers, "bucketed").value == 1.0
    with pytest.raises(ValueError, match="repeats"):
        alternate({"a": variant("a")}, repeats=0)


def test_a_sweep_counts_its_runs_on_one_progress_line(capsys):
    """A sweep of alternated runs shows how far it is (one line per run where no bar can
    redraw, when asked), on stderr only: stdout stays the lesson's own."""
    from types import SimpleNamespace

    from labkit.lessons.measure import alternate

    alternate({"a": lambda: SimpleNamespace(step_time_s=1.0),
               "b": lambda: SimpleNamespace(step_time_s=2.0)}, repeats=2, warmup=1,
              desc="bucket sweep", progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "bucket sweep: 1/6 a (warm-up)" and lines[-1] == "bucket sweep: 6/6 b (repeat 2)"
    alternate({"a": lambda: SimpleNamespace(step_time_s=1.0)}, repeats=1, progress=False)
    assert capsys.readouterr() == ("", "")


def test_a_run_without_the_rules_premise_is_inconclusive_whatever_its_numbers() -> None:
    """4 ranks on 2 cores beside hogs read holds one run and contradicted the next: a rule
    about ranks with a core each is inconclusive there, and the sentence says why."""
    from labkit.analysis.claims import INCONCLUSIVE, Claim, Sample, judge

    claim = Claim.within_factor(10.0, 1.5, "the step grows by the exposed all-reduce")
    for steps in ([10.0, 10.1, 9.9], [80.0, 81.0, 79.0]):  # would hold; would be contradicted
        v = judge(Sample.of(steps), claim, "4-rank step (ms)", fmt=".1f",
                  premise="4 ranks took turns on 2 cores")
        assert v.word == INCONCLUSIVE and not v.holds
        assert v.sentence().endswith("-- inconclusive on this machine (4 ranks took turns on 2 "
                                     "cores)")
