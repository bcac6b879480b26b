"""``labkit quiz``: take the quick test in a terminal, or print / score it for scripts.

Modes:
  labkit quiz [--seed N] [--new]                      ask in the terminal, one at a time;
                                                      resumes the attempt in progress (the
                                                      notebook widget's too) unless --new
  labkit quiz --seed N --print-questions [--json]     the drawn questions, no answers
  labkit quiz --seed N --answers FILE [--json]        score an answer sheet
  labkit quiz --progress                              saved attempts and weak concepts

An answer sheet is JSON: ``{"seed": N, "answers": {"<question id>": "<answer>", ...}}``
or a list of answers in question order (then the seed comes from ``--seed``); ``-`` reads
stdin. Exit codes: 0 scored (pass or fail; ``--strict`` makes a fail exit 1), 2 a bad
answer sheet or arguments (the message on stderr names the problem), 130 interrupted.
Scored attempts are saved to ``$LABKIT_HOME/quiz.json`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from labkit.quiz.answers import LETTERS
from labkit.quiz.engine import Attempt, Quiz
from labkit.quiz.questions import Kind, QuizError
from labkit.quiz.store import ProgressStore

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def register(subparsers: Any) -> None:
    """Add the ``quiz`` command to an argparse subparsers object (``func=handler``)."""
    p = subparsers.add_parser(
        "quiz", help="take the 10-question quick test (pass at 70%%)",
        description="Take the quick test interactively, or print / score it for scripts.")
    p.add_argument("--seed", type=int, default=None,
                   help="draw a reproducible attempt (same seed, same questions)")
    p.add_argument("--print-questions", action="store_true",
                   help="print the drawn questions (no answers) and exit")
    p.add_argument("--answers", metavar="FILE",
                   help='score a JSON answer sheet: {"seed": N, "answers": {id: answer}} '
                        "or a list in question order; '-' reads stdin")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--strict", action="store_true", help="exit 1 when the attempt fails")
    p.add_argument("--no-save", action="store_true", help="do not record this attempt")
    p.add_argument("--progress", action="store_true", help="show saved progress and exit")
    p.add_argument("--new", action="store_true",
                   help="start a fresh attempt instead of resuming the one in progress")
    p.set_defaults(func=handler)


def _error(message: str) -> int:
    print(f"labkit quiz: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def handler(args: argparse.Namespace) -> int:
    """Run the ``quiz`` command; returns the process exit code."""
    store = ProgressStore()
    try:
        if args.progress:
            print(store.summary())
            return EXIT_OK
        if args.print_questions and args.answers:
            return _error("--print-questions and --answers are separate modes; use one")
        if args.answers:
            attempt = _score_sheet(args)
        elif args.print_questions:
            attempt = Quiz.new_attempt(args.seed)
            _print_questions(attempt, as_json=args.json)
            return EXIT_OK
        else:
            if args.json:
                return _error("--json needs --print-questions or --answers FILE")
            attempt = _interactive(_start(args, store), None if args.no_save else store)
    except QuizError as exc:
        return _error(str(exc))
    except (KeyboardInterrupt, EOFError):
        saved = "" if args.no_save else "; your answers so far are saved: run `labkit quiz` to resume"
        print(f"\nquiz stopped{saved}", file=sys.stderr)
        return EXIT_INTERRUPTED

    if not args.no_save:
        try:
            store.record(attempt, source="cli")
            if not args.answers:
                print(f"Progress saved to {store.path}.")
        except OSError as exc:
            print(f"labkit quiz: warning: could not save progress to {store.path}: {exc}",
                  file=sys.stderr)
        if store.warning:
            print(f"labkit quiz: warning: {store.warning}", file=sys.stderr)
    if args.answers:
        if args.json:
            print(json.dumps(attempt.report(), indent=2))
        else:
            _print_report(attempt)
    return EXIT_FAILED if args.strict and not attempt.passed else EXIT_OK


# ---------------------------------------------------------------- answer sheets


def _load_sheet(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise QuizError(f"cannot read answer file {path!r}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise QuizError(f"answer file {path!r} is not valid JSON ({exc.msg} at line "
                        f"{exc.lineno}, column {exc.colno}); expected e.g. "
                        '{"seed": 42, "answers": {"lr-scaling-01": "1024"}}') from None


def _check_value(where: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
        raise QuizError(f"answer for {where} must be a string or a number, not "
                        f"{type(value).__name__} ({json.dumps(value)[:40]})")


def _score_sheet(args: argparse.Namespace) -> Attempt:
    sheet = _load_sheet(args.answers)
    seed = args.seed
    if isinstance(sheet, dict):
        extra = sorted(set(sheet) - {"seed", "answers"})
        if extra:
            raise QuizError(f"answer file has unexpected key(s) {extra}; it holds only "
                            '"seed" and "answers"')
        if "answers" not in sheet:
            raise QuizError('answer file has no "answers" key; expected '
                            '{"seed": 42, "answers": {"<question id>": "<answer>"}}')
        if "seed" in sheet:
            file_seed = sheet["seed"]
            if isinstance(file_seed, bool) or not isinstance(file_seed, int):
                raise QuizError(f'"seed" in the answer file must be an integer, not '
                                f"{json.dumps(file_seed)}")
            if seed is not None and seed != file_seed:
                raise QuizError(f"--seed {seed} does not match the answer file's seed "
                                f"{file_seed}; drop one of them")
            seed = file_seed
        answers = sheet["answers"]
        if not isinstance(answers, (dict, list)):
            raise QuizError('"answers" must be an object {"<question id>": "<answer>"} or a '
                            f"list in question order, not {type(answers).__name__}")
    elif isinstance(sheet, list):
        answers = sheet
    else:
        raise QuizError("answer file must hold a JSON object "
                        '{"seed": N, "answers": {...}} or a list of answers, not '
                        f"{type(sheet).__name__}")
    if seed is None:
        raise QuizError('missing seed: put "seed": N in the answer file or pass --seed N '
                        "(the seed that drew the questions)")
    if isinstance(answers, dict):
        for qid, value in answers.items():
            _check_value(repr(qid), value)
    else:
        for i, value in enumerate(answers):
            _check_value(f"question {i + 1}", value)
    attempt = Quiz.new_attempt(seed)
    attempt.answer_all(answers)
    return attempt


# ---------------------------------------------------------------- terminal output


def _question_lines(n: int, total: int, item: Any) -> list[str]:
    lines = [f"Q{n}/{total}  [{item.concept.value}]  {item.id}", f"  {item.prompt}"]
    lines += [f"    {LETTERS[i]}) {c}" for i, c in enumerate(item.choices)]
    if item.kind is Kind.NUMERIC:
        lines.append(f"    ({item.hint})")
    return lines


def _print_questions(attempt: Attempt, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(attempt.questions_json(), indent=2))
        return
    print(f"labkit quick test, seed {attempt.seed}: {attempt.total} questions, "
          f"pass at {attempt.pass_percent}%\n")
    for n, item in enumerate(attempt.items, 1):
        print("\n".join(_question_lines(n, attempt.total, item)) + "\n")


def _verdict(attempt: Attempt) -> str:
    word = "PASSED" if attempt.passed else "not passed yet"
    return (f"Score: {attempt.score}/{attempt.total} ({attempt.percent:g}%), "
            f"pass mark {attempt.pass_percent}%: {word}")


def _print_report(attempt: Attempt) -> None:
    for n, r in enumerate(attempt.ordered_results(), 1):
        mark = "correct" if r.correct else "wrong"
        note = f" ({r.message})" if r.message else ""
        print(f"Q{n} {r.id}: {mark}{note}; expected {r.expected}")
    print(_verdict(attempt))


def _start(args: argparse.Namespace, store: ProgressStore) -> Attempt:
    """The attempt in progress (widget's or terminal's) unless --new or another --seed."""
    if not args.new and not args.no_save:
        try:
            attempt = store.resume()
        except OSError:
            attempt = None
        if attempt is not None and args.seed in (None, attempt.seed):
            print(f"Resuming your attempt in progress (seed {attempt.seed}, "
                  f"{len(attempt.results)} of {attempt.total} answered); --new starts over.")
            return attempt
    return Quiz.new_attempt(args.seed)


def _interactive(attempt: Attempt, store: ProgressStore | None = None) -> Attempt:
    print(f"labkit quick test: {attempt.total} questions, pass at {attempt.pass_percent}%. "
          f"Seed {attempt.seed} (rerun with --seed {attempt.seed} for the same questions).")
    print("Answer with a letter for multiple choice, or a number. Ctrl-C stops; your "
          "answers are kept and `labkit quiz` resumes.\n")
    for n, item in enumerate(attempt.items, 1):
        if item.id in attempt.results:
            continue  # answered before a restart
        print("\n".join(_question_lines(n, attempt.total, item)))
        given = ""
        while not given.strip():
            given = input("  your answer: ")
        r = attempt.answer(item.id, given)
        if store is not None:
            try:
                store.save_current(attempt, source="cli")
            except OSError as exc:
                print(f"  (could not save progress: {exc})", file=sys.stderr)
        if r.correct:
            print("  Correct.")
        else:
            why = f" ({r.message})" if r.message else ""
            print(f"  Not quite{why}. Expected: {r.expected}")
        print(f"  Why: {r.explanation}\n")
    print(_verdict(attempt))
    return attempt
