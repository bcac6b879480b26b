"""``labkit quiz`` through an argparse harness: printing, scoring sheets, bad sheets, prompts.

The lead wires ``register`` into the real ``labkit`` CLI; here a bare parser does the same.
"""

from __future__ import annotations

import argparse
import json

import pytest

from labkit.quiz import Kind, Quiz
from labkit.quiz.answers import LETTERS
from labkit.quiz.cli import register


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="labkit")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["quiz", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Keep progress files out of the real home directory."""
    monkeypatch.setenv("LABKIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def answers_for(seed: int, n_right: int) -> dict[str, str]:
    out = {}
    for i, item in enumerate(Quiz.new_attempt(seed).items):
        if item.kind is Kind.CHOICE:
            assert item.answer_index is not None
            shift = 0 if i < n_right else 1
            out[item.id] = LETTERS[(item.answer_index + shift) % len(item.choices)]
        else:
            assert item.answer_value is not None
            value = item.answer_value if i < n_right else item.answer_value * 3 + 1
            out[item.id] = repr(value)
    return out


def sheet(tmp_path, content, name="answers.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_print_questions_json_lists_ten_questions_without_answers(capsys):
    code, out, _ = run(["--seed", "3", "--print-questions", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["seed"] == 3 and len(data["questions"]) == 10
    attempt = Quiz.new_attempt(3)
    assert [q["id"] for q in data["questions"]] == attempt.ids
    for q in data["questions"]:
        assert {"id", "prompt", "choices", "kind"} <= set(q)
        assert not {"expected", "answer", "explanation"} & set(q)
    assert run(["--seed", "3", "--print-questions", "--json"], capsys)[1] == out


def test_print_questions_as_text_letters_the_choices(capsys):
    code, out, _ = run(["--seed", "3", "--print-questions"], capsys)
    assert code == 0 and "Q1/10" in out and "A) " in out


def test_perfect_sheet_scores_100_and_prints_one_json_object(tmp_path, capsys, home):
    path = sheet(tmp_path, {"seed": 8, "answers": answers_for(8, 10)})
    code, out, _ = run(["--answers", path, "--json"], capsys)
    report = json.loads(out)
    assert code == 0
    assert (report["seed"], report["score"], report["total"]) == (8, 10, 10)
    assert report["percent"] == 100.0 and report["passed"] is True
    for r in report["results"]:
        assert {"id", "concept", "correct", "given", "expected", "explanation"} <= set(r)
    assert json.loads((home / "quiz.json").read_text())["attempts"][0]["score"] == 10


@pytest.mark.parametrize("n_right, passed, strict_code", [(6, False, 1), (7, True, 0)])
def test_six_fails_seven_passes_and_strict_sets_the_exit_code(tmp_path, capsys, n_right,
                                                              passed, strict_code):
    path = sheet(tmp_path, {"seed": 21, "answers": answers_for(21, n_right)})
    code, out, _ = run(["--answers", path, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["score"] == n_right and report["passed"] is passed
    assert run(["--answers", path, "--json", "--strict"], capsys)[0] == strict_code


def test_list_sheet_in_question_order_with_seed_flag(tmp_path, capsys):
    answers = list(answers_for(5, 10).values())
    path = sheet(tmp_path, answers)
    code, out, _ = run(["--seed", "5", "--answers", path, "--json"], capsys)
    assert code == 0 and json.loads(out)["score"] == 10


def test_unreadable_answer_scores_zero_with_a_message_not_an_error(tmp_path, capsys):
    answers = answers_for(8, 10)
    first = next(iter(answers))
    answers[first] = "no idea"
    code, out, _ = run(["--answers", sheet(tmp_path, {"seed": 8, "answers": answers}),
                        "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["score"] == 9
    assert report["results"][0]["correct"] is False and report["results"][0]["message"]


def test_partial_sheet_scores_missing_questions_as_unanswered(tmp_path, capsys):
    answers = dict(list(answers_for(8, 10).items())[:7])
    code, out, _ = run(["--answers", sheet(tmp_path, {"seed": 8, "answers": answers}),
                        "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["score"] == 7 and report["passed"] is True


@pytest.mark.parametrize("content, argv, expect", [
    ("{not json", [], "not valid JSON"),
    ('"just a string"', [], "must hold a JSON object"),
    ({"answers": {}}, [], "missing seed"),
    (["a", "b"], [], "missing seed"),
    ({"seed": 8}, [], 'no "answers"'),
    ({"seed": "8", "answers": {}}, [], '"seed" in the answer file must be an integer'),
    ({"seed": 8, "answers": "b"}, [], '"answers" must be an object'),
    ({"seed": 8, "answers": {"made-up-07": "b"}}, [], "made-up-07"),
    ({"seed": 8, "answers": ["a", "b"]}, [], "has 2 entries"),
    ({"seed": 8, "answers": {}, "extra": 1}, [], "unexpected key"),
    ({"seed": 8, "answers": []}, ["--seed", "9"], "does not match"),
    ({"seed": 8, "answers": [[1]] * 10}, [], "must be a string or a number"),
])
def test_malformed_answer_files_exit_2_with_a_message_naming_the_problem(
        tmp_path, capsys, home, content, argv, expect):
    code, out, err = run([*argv, "--answers", sheet(tmp_path, content), "--json"], capsys)
    assert code == 2
    assert expect in err
    assert out == ""
    assert not (home / "quiz.json").exists()


def test_missing_answer_file_exits_2(tmp_path, capsys):
    code, _, err = run(["--answers", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and "cannot read answer file" in err


def test_json_without_a_mode_and_conflicting_modes_exit_2(tmp_path, capsys):
    assert run(["--json"], capsys)[0] == 2
    path = sheet(tmp_path, {"seed": 1, "answers": {}})
    assert run(["--print-questions", "--answers", path], capsys)[0] == 2


def test_no_save_leaves_no_progress_file(tmp_path, capsys, home):
    path = sheet(tmp_path, {"seed": 8, "answers": answers_for(8, 10)})
    assert run(["--answers", path, "--json", "--no-save"], capsys)[0] == 0
    assert not (home / "quiz.json").exists()


def test_interactive_quiz_asks_explains_scores_and_saves(capsys, monkeypatch, home):
    answers = iter(["", *answers_for(13, 7).values()])  # a blank line is asked again
    monkeypatch.setattr("builtins.input", lambda _prompt="": next(answers))
    code, out, _ = run(["--seed", "13"], capsys)
    assert code == 0
    assert out.count("Why: ") == 10
    assert "Score: 7/10 (70%)" in out and "PASSED" in out
    saved = json.loads((home / "quiz.json").read_text())
    assert saved["attempts"][0]["source"] == "cli"
    code, out, _ = run(["--progress"], capsys)
    assert code == 0 and "best: 7/10" in out


def test_interactive_quiz_stops_cleanly_on_end_of_input(capsys, monkeypatch, home):
    def eof(_prompt=""):
        raise EOFError
    monkeypatch.setattr("builtins.input", eof)
    code, _, err = run(["--seed", "13"], capsys)
    assert code == 130 and "run `labkit quiz` to resume" in err
    assert not (home / "quiz.json").exists()  # nothing answered, nothing to keep


def test_interactive_quiz_saves_each_answer_and_resumes_after_a_stop(capsys, monkeypatch, home):
    """Two answers, then Ctrl-C; the next `labkit quiz` asks only the remaining eight."""
    answers = iter(["a", "b"])

    def two_then_stop(_prompt=""):
        try:
            return next(answers)
        except StopIteration:
            raise KeyboardInterrupt from None
    monkeypatch.setattr("builtins.input", two_then_stop)
    code, _, _ = run(["--seed", "13"], capsys)
    assert code == 130
    saved = json.loads((home / "quiz.json").read_text())["current"]
    assert saved["seed"] == 13 and len(saved["answers"]) == 2
    asked = []
    monkeypatch.setattr("builtins.input", lambda _p="": asked.append(1) or "a")
    code, out, _ = run([], capsys)
    assert code == 0 and "Resuming your attempt in progress (seed 13, 2 of 10" in out
    assert len(asked) == 8
    assert "current" not in json.loads((home / "quiz.json").read_text())


def test_unwritable_progress_location_warns_but_still_scores(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LABKIT_HOME", str(blocker / "home"))  # cannot mkdir under a file
    path = sheet(tmp_path, {"seed": 8, "answers": answers_for(8, 10)})
    code, out, err = run(["--answers", path, "--json"], capsys)
    assert code == 0 and json.loads(out)["score"] == 10
    assert "could not save progress" in err
