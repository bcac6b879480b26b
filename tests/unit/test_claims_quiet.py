"""How the notebook checks hold a lesson's timed claims (``tests/notebooks/claims``): a miss on
a quiet machine fails the check, with every such miss listed at once; on a busy machine (other
programs' CPU while the lesson ran, or now) a miss passes only if the lesson said why."""

from __future__ import annotations

import pytest

from labkit.lessons.machine import Load
from tests.notebooks.claims import check, verdicts


@pytest.fixture
def reading(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Other programs' CPU now (cores); the harness's reading over the run is ``check``'s."""
    from tests.notebooks import teaching

    now = [0.0]
    monkeypatch.setattr(verdicts, "load_now", lambda fresh=False: Load(1.9, 2, now[0]))
    monkeypatch.setattr(teaching, "break_mechanisms", lambda stem, ns: "")  # no notebook here
    return now


def _lesson(*misses: tuple[bool, str, str | None]):
    def fn(ns: dict) -> None:
        for holds, detail, said in misses:
            verdicts.timed(holds, detail, said)
    return fn


def test_quiet_misses_are_all_reported(monkeypatch: pytest.MonkeyPatch, reading: list[float]) -> None:
    from tests.notebooks import claims
    monkeypatch.setitem(claims.CHECKS, "99_test", _lesson((False, "first", None), (True, "ok", None),
                                                           (False, "second", None)))
    with pytest.raises(AssertionError) as err:
        check("99_test", {}, others=0.05)
    text = str(err.value)
    assert "2 timed claim(s) of 99_test missed on a quiet machine" in text
    assert "first on a quiet machine (other programs used 0.1 of 2 cores" in text
    assert "second on a quiet machine" in text


def test_busy_during_the_run_excuses_a_miss_the_lesson_explained(
        monkeypatch: pytest.MonkeyPatch, reading: list[float]) -> None:
    from tests.notebooks import claims
    monkeypatch.setitem(claims.CHECKS, "99_test", _lesson(
        (False, "bubble", f"1F1B missed; {verdicts.SAID}")))
    assert check("99_test", {}, others=1.4).startswith("99_test")  # quiet now, busy during
    monkeypatch.setitem(claims.CHECKS, "99_test", _lesson((False, "bubble", "1F1B missed")))
    with pytest.raises(AssertionError, match="the lesson did not say why"):
        check("99_test", {}, others=1.4)
    reading[0] = 1.2  # busy now, quiet during: the busier reading counts
    monkeypatch.setitem(claims.CHECKS, "99_test", _lesson(
        (False, "bubble", f"1F1B missed; {verdicts.SAID}")))
    assert check("99_test", {}, others=0.0).startswith("99_test")


def _ratio(*runs: float):
    from labkit.analysis.claims import Claim, Sample, judge

    return judge(Sample.of(runs), Claim.above(1.0, "the small bucket's step is shorter"),
                 "big / small step")


def _logged(monkeypatch: pytest.MonkeyPatch, tmp_path, name: str, *found) -> list[dict]:
    """``found``'s verdicts as lesson 99 logs them, through ``check``, in a log of their own."""
    from tests.notebooks import claims
    from tests.notebooks.claims.flips import read_log

    log = tmp_path / f"{name}.jsonl"
    monkeypatch.setenv(verdicts.LOG_ENV, str(log))
    monkeypatch.setitem(claims.CHECKS, "99_test", lambda ns: verdicts.log_verdicts(list(found)))
    check("99_test", {}, others=1.5)
    return read_log(log)


def test_two_runs_that_say_holds_then_contradicted_are_a_flip(
        monkeypatch: pytest.MonkeyPatch, reading: list[float], tmp_path) -> None:
    """The log keeps each verdict's lesson, word and numbers; holds -> contradicted is a flip,
    holds -> inconclusive only a change, and the same word nothing."""
    from labkit.analysis.claims import CONTRADICTED, HOLDS, INCONCLUSIVE
    from tests.notebooks.claims.flips import flips, report

    held, missed, unsure = _ratio(1.3, 1.4, 1.35), _ratio(0.7, 0.8, 0.75), _ratio(0.9, 1.3)
    assert (held.word, missed.word, unsure.word) == (HOLDS, CONTRADICTED, INCONCLUSIVE)
    first = _logged(monkeypatch, tmp_path, "a", held, held)
    assert [(r["lesson"], r["what"], r["word"]) for r in first] == [
        ("99_test", "big / small step", HOLDS)] * 2
    assert first[0]["busy"] and first[0]["value"] == 1.35
    same = flips(first, _logged(monkeypatch, tmp_path, "b", held, held))
    assert (same.compared, same.flipped, same.changed) == (2, (), ())
    c = flips(first, _logged(monkeypatch, tmp_path, "c", missed, unsure))
    assert c.compared == 2 and len(c.flipped) == 1 and len(c.changed) == 1
    assert "holds (1.35 +- 0.05" in c.flipped[0] and "then contradicted (0.75" in c.flipped[0]
    assert "FLIPPED 99_test: big / small step" in report(c)


def test_a_verdict_in_one_run_only_is_listed_not_compared(
        monkeypatch: pytest.MonkeyPatch, reading: list[float], tmp_path) -> None:
    from tests.notebooks.claims.flips import flips

    c = flips(_logged(monkeypatch, tmp_path, "a", _ratio(1.3, 1.4)),
              _logged(monkeypatch, tmp_path, "b", _ratio(0.7, 0.8), _ratio(0.7, 0.8)))
    assert (c.compared, c.flipped, c.only_one) == (1, (c.flipped[0],), ("99_test: big / small step",))
    assert not flips([], _logged(monkeypatch, tmp_path, "c", _ratio(1.3, 1.4))).compared
