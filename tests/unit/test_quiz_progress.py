"""The quick test's saved progress, notebook widget and lesson notebook.

Progress goes to a temporary ``$LABKIT_HOME``; the widget is driven through its own
controls (set a value, ``button.click()``), the way a student would use it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.quiz import Attempt, Kind, ProgressStore, Quiz
from tests.unit.test_quiz import right, wrong

REPO = Path(__file__).resolve().parents[2]



# ---------------------------------------------------------------- saved progress


def scored(seed: int, n_right: int) -> Attempt:
    a = Quiz.new_attempt(seed)
    a.answer_all([right(it) if i < n_right else wrong(it) for i, it in enumerate(a.items)])
    return a


def test_progress_file_round_trips_attempts_best_and_concept_accuracy(tmp_path, monkeypatch):
    """Default path is $LABKIT_HOME/quiz.json; a fresh store reads back what was saved."""
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path / "home"))
    ProgressStore().record(scored(1, 8))
    ProgressStore().record(scored(2, 5))
    path = tmp_path / "home" / "quiz.json"
    data = json.loads(path.read_text())
    assert data == ProgressStore(path).load()
    assert [a["score"] for a in data["attempts"]] == [8, 5]
    assert data["best"]["score"] == 8 and data["best"]["seed"] == 1
    assert sum(c["answered"] for c in data["concepts"].values()) == 20
    assert sum(c["correct"] for c in data["concepts"].values()) == 13
    for c in data["concepts"].values():
        assert c["accuracy"] == pytest.approx(c["correct"] / c["answered"], abs=1e-4)
    assert list(path.parent.iterdir()) == [path], "temp files left behind"


def test_progress_write_is_atomic_when_saving_fails(tmp_path, monkeypatch):
    """A failure mid-write leaves the previous file intact and no temp file."""
    store = ProgressStore(tmp_path / "quiz.json")
    store.record(scored(1, 7))
    before = store.path.read_text()

    def boom(*_a, **_k):
        raise OSError("disk full")
    monkeypatch.setattr("labkit.base.files.os.fsync", boom)  # written, not yet durable
    with pytest.raises(OSError):
        store.record(scored(2, 9))
    assert store.path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["quiz.json"]


def test_corrupt_progress_file_is_moved_aside_with_a_warning(tmp_path):
    path = tmp_path / "quiz.json"
    path.write_text("{not json")
    store = ProgressStore(path)
    data = store.record(scored(3, 7))
    assert len(data["attempts"]) == 1
    assert store.warning and "quiz.json.corrupt" in store.warning
    assert (tmp_path / "quiz.json.corrupt").read_text() == "{not json"


# ---------------------------------------------------------------- widget and notebook


def play(panel, n_right: int) -> None:
    """Answer through the widget's own controls: set a value, click Check, click Next."""
    for i, item in enumerate(panel.attempt.items):
        given = right(item) if i < n_right else wrong(item)
        if item.kind is Kind.CHOICE:
            panel.choices.value = given
        else:
            panel.number.value = given
        panel.check_button.click()
        assert panel.progress.value == i + 1
        assert item.explanation[:40] in panel.feedback.value.replace("&#x27;", "'")
        panel.next_button.click()


@pytest.mark.parametrize("n_right, verdict", [(7, "Passed"), (6, "Not passed yet")])
def test_widget_plays_an_attempt_and_shows_the_final_score(tmp_path, n_right, verdict):
    from labkit.widgets.quiz import quiz_widget

    box = quiz_widget(seed=4, store=tmp_path / "quiz.json")
    panel = box.panel
    assert "question 1 of 10" in panel.title.value
    play(panel, n_right)
    assert f"Score: {n_right}/10" in panel.summary.value
    assert verdict in panel.summary.value
    saved = json.loads((tmp_path / "quiz.json").read_text())
    assert saved["attempts"][0]["score"] == n_right


def test_kernel_restart_resumes_the_attempt_in_progress_in_widget_and_terminal(tmp_path):
    """Answers are saved as they are checked; a new widget (a restarted kernel) and
    ``labkit quiz`` both pick the attempt up where it stopped; finishing clears it."""
    import argparse

    from labkit.quiz.cli import _start
    from labkit.widgets.quiz import quiz_widget

    path = tmp_path / "quiz.json"
    first = quiz_widget(store=path).panel
    for item in first.attempt.items[:3]:
        given = right(item)
        if item.kind is Kind.CHOICE:
            first.choices.value = given
        else:
            first.number.value = given
        first.check_button.click()
        first.next_button.click()
    seed = first.attempt.seed
    del first  # the kernel restarts: nothing of the old objects survives
    again = quiz_widget(store=path).panel
    assert again.attempt.seed == seed and again.index == 3
    assert len(again.attempt.results) == 3 and again.attempt.score == 3
    assert "question 4 of 10" in again.title.value
    args = argparse.Namespace(new=False, no_save=False, seed=None)
    terminal = _start(args, ProgressStore(path))
    assert terminal.seed == seed and terminal.score == 3  # the CLI resumes the same attempt
    assert _start(argparse.Namespace(new=True, no_save=False, seed=None),
                  ProgressStore(path)).results == {}
    play_rest(again)
    assert ProgressStore(path).current() is None  # finished: recorded, nothing to resume
    assert json.loads(path.read_text())["attempts"][0]["seed"] == seed


def play_rest(panel) -> None:
    while panel.item.id not in panel.attempt.results:
        item = panel.item
        if item.kind is Kind.CHOICE:
            panel.choices.value = right(item)
        else:
            panel.number.value = right(item)
        panel.check_button.click()
        panel.next_button.click()


def test_widget_check_without_an_answer_asks_for_one_and_scores_nothing(tmp_path):
    from labkit.widgets.quiz import quiz_widget

    panel = quiz_widget(seed=4, store=tmp_path / "q.json").panel
    panel.check_button.click()
    assert "First" in panel.feedback.value
    assert panel.attempt.results == {}
    panel.next_button.click()  # ignored until the question is checked
    assert panel.index == 0


def test_widget_malformed_number_scores_zero_with_a_message(tmp_path):
    from labkit.widgets.quiz import quiz_widget

    panel = quiz_widget(seed=4, store=tmp_path / "q.json").panel
    while panel.item.kind is not Kind.NUMERIC:
        panel.choices.value = right(panel.item)
        panel.check_button.click()
        panel.next_button.click()
    panel.number.value = "lots"
    panel.check_button.click()
    assert "could not read" in panel.feedback.value
    assert panel.attempt.results[panel.item.id].correct is False


def test_quick_test_notebook_is_thin_and_has_no_outputs():
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / "08_quick_test.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert any("quiz_widget()" in c.source for c in code)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "70%" in text and "labkit quiz" in text
