"""Lesson 01's strong-scaling verdict (``labkit.lessons.dp_verdicts.speedup_verdict``): the
table's speedup (medians of alternated repeats) judged with the spread of the repeats'
pair-by-pair ratios, so two busy runs cannot read "holds" and "contradicted" for one machine
(the issue: Amdahl's f was 0.000 in one run and 0.798 in the other)."""

from __future__ import annotations

from types import SimpleNamespace

from labkit.lessons.dp_verdicts import speedup_verdict


def _amdahl(one: list[float], two: list[float]) -> SimpleNamespace:
    med = lambda xs: sorted(xs)[(len(xs) - 1) // 2]
    return SimpleNamespace(step_times={1: med(one), 2: med(two)}, repeats={1: one, 2: two})


def test_steady_repeats_hold_and_the_value_is_the_tables() -> None:
    v = speedup_verdict(_amdahl([0.060, 0.062, 0.061], [0.040, 0.041, 0.040]))
    assert v.word == "holds" and v.sample.value == 0.061 / 0.040
    assert "speedup t_1 / t_2 1.52 +-" in v.sentence()


def test_repeats_that_swing_across_one_are_inconclusive_not_a_verdict_either_way() -> None:
    v = speedup_verdict(_amdahl([0.060, 0.090, 0.061], [0.050, 0.045, 0.080]))
    assert v.word == "inconclusive", v.sentence()


def test_one_run_each_takes_the_single_run_noise() -> None:
    v = speedup_verdict(_amdahl([0.060], [0.058]))
    assert v.word == "inconclusive" and "+- 0.10" in v.sentence()  # 1.03 +- 10 %


def _weak(steps_s: list[float], others: float | None = None) -> SimpleNamespace:
    """A 2-rank run of ``steps_s`` (the first is warm-up), judged with ``others`` cores of other
    programs' CPU kept (None: nothing kept yet)."""
    from labkit.lessons.machine import JUDGED_LOAD

    run = SimpleNamespace(step_time_s=sorted(steps_s[1:])[len(steps_s[1:]) // 2],
                          timeline=SimpleNamespace(step_times_s=lambda: steps_s), metrics={})
    if others is not None:
        run.metrics[JUDGED_LOAD] = {"load": 3.0, "cores": 2, "others": others}
    return run


def test_weak_scaling_beside_busy_programs_is_inconclusive_saying_why(monkeypatch) -> None:
    """Beside two hogs the 2-rank step read holds (prediction 32 ms) and then contradicted
    (prediction 74 ms: the bench's wire, timed on the busy machine at another moment): the
    ranks had no core each, a premise of the rule, so the verdict says so instead."""
    from labkit.lessons import dp_verdicts

    monkeypatch.setattr("labkit.base.devices.cpu_count", lambda: 2)
    quiet = _weak([0.05, 0.0279, 0.028, 0.0281], others=0.0)
    assert dp_verdicts.scaling_verdict({2: quiet}, {2: 0.074}, 2).word == "contradicted"
    busy = _weak([0.05, 0.0279, 0.028, 0.0281], others=2.0)
    v = dp_verdicts.scaling_verdict({2: busy}, {2: 0.074}, 2)
    assert v.word == "inconclusive", v.sentence()
    assert "other programs used 2.0 of 2 cores" in v.sentence()
    assert "the 2 ranks did not have a core each" in v.sentence()


def test_weak_scaling_is_judged_again_on_the_load_it_was_first_judged_at(monkeypatch) -> None:
    """The notebook's check judges the run again minutes later: it must read the load the
    lesson read, not the load of that moment."""
    from labkit.lessons import dp_verdicts, machine

    monkeypatch.setattr("labkit.base.devices.cpu_count", lambda: 2)
    readings = iter([machine.Load(3.0, 2, 1.9), machine.Load(0.5, 2, 0.0)])
    monkeypatch.setattr(machine, "load_now", lambda fresh=False: next(readings))
    run = _weak([0.05, 0.030, 0.031, 0.029])
    first = dp_verdicts.scaling_verdict({2: run}, {2: 0.030}, 2)
    again = dp_verdicts.scaling_verdict({2: run}, {2: 0.030}, 2)
    assert first.word == again.word == "inconclusive" and first.sentence() == again.sentence()
    assert run.metrics[machine.JUDGED_LOAD]["others"] == 1.9


def _bucket_run(step_s: float, hidden: float, others: float) -> SimpleNamespace:
    from labkit.lessons.machine import JUDGED_LOAD

    return SimpleNamespace(step_time_s=step_s, config=SimpleNamespace(world_size=2),
                           metrics={"overlap_fraction": hidden, JUDGED_LOAD: {
                               "load": 1.0, "cores": 2, "others": others}})


def test_a_shorter_step_from_hiding_is_judged_only_with_cores_for_the_all_reduce_threads(
        monkeypatch) -> None:
    """Two ranks hide their all-reduce in a thread each beside backward: with 4 free cores the
    shorter step is judged; on 2 cores (or 4 with two busy) it is inconclusive, saying why --
    beside two hogs it read holds, then contradicted, on the same 2 cores."""
    from labkit.lessons.dp_verdicts import bucket_verdicts

    def sweep(others: float) -> dict[float, list[SimpleNamespace]]:
        return {1.0: [_bucket_run(0.020, 0.4, others) for _ in range(3)],
                25.0: [_bucket_run(s, 0.1, others) for s in (0.024, 0.025, 0.026)]}

    monkeypatch.setattr("labkit.base.devices.cpu_count", lambda: 4)
    hidden, faster = bucket_verdicts(sweep(0.0))
    assert (hidden.word, faster.word) == ("holds", "holds"), faster.sentence()
    _, busy = bucket_verdicts(sweep(2.0))
    assert busy.word == "inconclusive" and "needs 4 cores for 2 ranks" in busy.sentence()
    assert "other programs used 2.0 of 2 cores" in busy.sentence()
    monkeypatch.setattr("labkit.base.devices.cpu_count", lambda: 2)
    hidden, small = bucket_verdicts(sweep(0.0))
    assert hidden.word == "holds" and small.word == "inconclusive"
    assert "this machine has 2)" in small.sentence()
