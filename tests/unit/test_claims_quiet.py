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
