"""Lesson 01's measured roofline and bucket-overlap count, from hand-made numbers and traces:
the crossover is where all-reduce / compute crosses 1, the sentence, the reveal and the figure
read one number, and "launched before backward ended" is counted from the trace's order."""

from __future__ import annotations

import math

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.lessons.dp_lesson import launched_in_backward, overlap_text
from labkit.lessons.dp_roofline import (
    Roofline,
    roofline_text,
    roofline_verdicts,
    smallest_batch_text,
)

pytestmark = pytest.mark.lesson01
MS = 1e-3


def _roof(comm_ms: list[float]) -> Roofline:
    """Compute 1 ms + 0.1 ms per sample; the all-reduce of each repeat flat at ``comm_ms``."""
    batches = [4, 32, 256, 1024]
    compute = [[(1 + 0.1 * b) * MS for b in batches] for _ in comm_ms]
    allreduce = [[c * MS] * len(batches) for c in comm_ms]
    return Roofline(batches, compute, allreduce, params=200_000, world_size=2)


def test_crossover_interpolates_where_the_ratio_crosses_one() -> None:
    """All-reduce 5 ms: compute 1.4 ms at 4 and 4.2 ms at 32 (below), 26.6 ms at 256 (above):
    the ratio crosses 1 between 32 and 256, log-interpolated."""
    r = _roof([5.0])
    lo, hi = math.log(5 / 4.2), math.log(5 / 26.6)
    want = math.exp(math.log(32) + lo / (lo - hi) * (math.log(256) - math.log(32)))
    assert r.crossovers() == [pytest.approx(want)]
    assert 32 < r.crossover() < 256


def test_one_number_for_sentence_reveal_and_figure() -> None:
    """Three repeats: the median crossover is what the sentence prints."""
    r = _roof([3.0, 5.0, 8.0])
    assert f"about {r.crossover():.0f} samples per rank" in roofline_text(r)
    assert r.crossover() == sorted(r.crossovers())[1]


def test_no_crossing_in_range_says_so() -> None:
    r = _roof([0.5])  # the all-reduce is shorter than compute at every batch
    assert math.isnan(r.crossover())
    assert "lies outside the measured range" in roofline_text(r)


def test_verdicts_hold_for_a_clean_roofline() -> None:
    """Repeats that agree: the ends hold, a flat all-reduce holds; the FLOP/s is 6P / slope."""
    text = roofline_text(_roof([20.0, 20.5, 21.0]))
    assert "at batch 4" in text and text.count("-- holds") == 3
    assert _roof([5.0]).flops_per_s() == pytest.approx(6 * 200_000 / (0.1 * MS))
    assert math.isnan(Roofline([4, 8], [[1.0, 1.0]], [[1.0, 1.0]], 10, 2).formula_crossover(1e9))


def test_a_cpu_whose_floor_outlasts_the_all_reduce_is_compute_bound_at_every_batch() -> None:
    """A 2-core laptop's numbers (floor 2.8 ms, 0.078 ms a sample, all-reduce 2.0 ms): the
    floor + slope model holds at batch 4, the smallest batch is said to be compute-bound with
    its noise, and no crossover is predicted or measured -- nothing reads "contradicted"."""
    batches = [4, 32, 256, 1024]
    compute = [[(2.8 + 0.078 * b) * f * MS for b in batches] for f in (1.0, 1.02, 0.99)]
    allreduce = [[a * MS] * 4 for a in (2.0, 2.1, 1.95)]
    r = Roofline(batches, compute, allreduce, params=810_000, world_size=2)
    model, above, flat = roofline_verdicts(r)
    assert model.holds and above.holds and flat.holds
    assert math.isnan(r.floor_crossover()) and math.isnan(r.crossover())
    text = roofline_text(r)
    assert "compute outlasts the all-reduce" in text and "no batch is communication-bound" in text
    assert "compute = floor 2.80 ms" in text and "contradicted" not in text


def test_the_floor_model_predicts_the_crossover_and_can_miss() -> None:
    """Floor 1 ms, 0.1 ms a sample, all-reduce 5 ms: the floor puts the crossover at
    (5 - 1) / 0.1 = 40 samples. Batch 4 at three times the line's compute contradicts it."""
    r = _roof([5.0, 5.0])
    assert r.floor_fit() == [pytest.approx((1 * MS, 0.1 * MS))] * 2
    assert r.floor_crossover() == pytest.approx(40)
    assert "about 40 samples per rank" in smallest_batch_text(r)
    assert "communication-bound" in smallest_batch_text(r)
    slow = _roof([5.0, 5.0])
    for row in slow.compute:
        row[0] *= 3
    assert roofline_verdicts(slow)[0].word == "contradicted"


def _trace(launch_ms: list[float], backward_end_ms: float) -> Timeline:
    ns = 1_000_000
    ev = [Event(0, Lane.STEP, Op.STEP, 0, 100 * ns, step=0),
          Event(0, Lane.COMPUTE, Op.BACKWARD, 0, int(backward_end_ms * ns))]
    ev += [Event(0, Lane.COMM, Op.ALL_REDUCE, int(t * ns), 5 * ns) for t in launch_ms]
    return Timeline(ev, 1)


def test_overlap_is_counted_from_launch_order() -> None:
    """Two buckets launched inside backward and one after it: 2 of 3; none inside: 'nothing
    could overlap'."""
    assert launched_in_backward(_trace([10, 20, 60], 50), 0) == {0: (2, 3)}
    assert "rank 0 2 of 3 -- the first bucket went on the wire" in overlap_text(
        _trace([10, 20, 60], 50), {"yours": 0})
    assert "nothing could overlap" in overlap_text(_trace([60, 70], 50), {"naive": 0})


def test_a_line_a_loaded_repeat_tipped_below_zero_is_left_out_and_said() -> None:
    """Beside two hogs one repeat's batch-256 compute waited for a core: its line through 32
    and 256 falls below zero at batch 4. That repeat is left out of the ratio and the
    verdict is inconclusive, saying why -- never a negative ratio read as contradicted."""
    r = _roof([5.0, 5.0, 5.0])
    r.compute[1][2] = 100 * MS  # batch 256 at 100 ms, batch 32 at 4.2: the line's floor < 0
    floor = roofline_verdicts(r)[0]
    assert floor.word == "inconclusive" and floor.sample.value == pytest.approx(1.0)
    assert "1 of 3 repeats' lines fell below zero at batch 4" in floor.sentence()
    assert r.floor_model()[0] == pytest.approx(1 * MS)  # the text reads the kept repeats too


def test_every_repeats_line_below_zero_still_gives_the_three_verdicts() -> None:
    """A sweep whose every repeat tipped its line below zero: the floor's verdict is there,
    inconclusive and saying why, so a lesson reading three verdicts never breaks."""
    r = _roof([5.0, 5.0])
    for row in r.compute:
        row[2] = 100 * MS
    floor, above, flat = roofline_verdicts(r)
    assert floor.word == "inconclusive" and "2 of 2 repeats' lines fell below zero" in \
        floor.sentence() and "the line's not measured" in floor.sentence()
