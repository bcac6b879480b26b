"""The quick test as a notebook widget: one question at a time, Check, Next, final score.

All quiz logic lives in ``labkit.quiz`` (drawing, reading answers, scoring, saving); this
module only lays out ipywidgets and forwards clicks to the engine, so the same attempt
scores the same way here, in the terminal (``labkit quiz``) and in tests. The widget's
parts are attributes of :class:`QuizPanel` (``choices``, ``number``, ``check_button``,
``next_button``, ``summary``...) so a test can set values and call ``button.click()``.
"""

from __future__ import annotations

import html
import os
from typing import Any

import ipywidgets as widgets

from labkit.quiz.answers import LETTERS
from labkit.quiz.engine import Attempt, Quiz
from labkit.quiz.questions import Item, Kind, Result
from labkit.quiz.store import ProgressStore

_HIDE, _SHOW = "none", ""


class QuizPanel:
    """The widgets of one quiz session and the handlers that drive the engine."""

    def __init__(self, seed: int | None = None, *, quiz: Quiz | None = None,
                 store: ProgressStore | str | os.PathLike[str] | None = None,
                 save: bool = True, resume: bool = True):
        self.quiz = quiz or Quiz()
        self.store = store if isinstance(store, ProgressStore) else ProgressStore(store)
        self.save = save
        self.saved: dict | None = None
        # 1. the parts, created once and reused for every question
        self.title = widgets.HTML()
        self.progress = widgets.IntProgress(min=0, value=0, description="Answered")
        self.prompt = widgets.HTML()
        self.choices = widgets.RadioButtons(options=[], value=None,
                                            layout=widgets.Layout(width="auto"))
        self.number = widgets.Text(placeholder="a number, e.g. 0.004 or 4e-3",
                                   description="Answer")
        self.check_button = widgets.Button(description="Check", button_style="primary")
        self.next_button = widgets.Button(description="Next")
        self.restart_button = widgets.Button(description="New attempt")
        self.feedback = widgets.HTML()
        self.summary = widgets.HTML()
        self.check_button.on_click(self._on_check)
        self.next_button.on_click(self._on_next)
        self.restart_button.on_click(lambda _b: self.start(None, resume=False))
        self.box = widgets.VBox([
            self.title, self.progress, self.prompt, self.choices, self.number,
            widgets.HBox([self.check_button, self.next_button]), self.feedback,
            self.summary, self.restart_button])
        # 2. the first attempt: the one in progress (after a kernel restart, or from
        #    `labkit quiz`) when there is one, else a fresh draw
        self.start(seed, resume=resume)

    # ------------------------------------------------------------ state

    def start(self, seed: int | None, *, resume: bool = False) -> None:
        """Resume the saved attempt in progress (``resume``) or draw a new one; show it."""
        resumed = self._resumed(seed) if resume and self.save else None
        if resumed is None and self.save:
            self._store_call(self.store.clear_current)
        self.attempt: Attempt = resumed or self.quiz.new_attempt(seed)
        self.index = next((i for i, it in enumerate(self.attempt.items)
                           if it.id not in self.attempt.results), self.attempt.total - 1)
        self.saved = None
        self.progress.max = self.attempt.total
        self.summary.value = ""
        self.restart_button.layout.display = _HIDE
        self._show()

    def _resumed(self, seed: int | None) -> Attempt | None:
        try:
            attempt = self.store.resume(self.quiz)
        except OSError:
            return None
        return attempt if attempt is not None and seed in (None, attempt.seed) else None

    def _store_call(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Save progress; a read-only home only costs the save, never the quiz."""
        try:
            fn(*args, **kwargs)
        except OSError as exc:
            self.feedback.value += (f"<p><i>Could not save progress to "
                                    f"{html.escape(str(self.store.path))}: "
                                    f"{html.escape(str(exc))}</i></p>")

    @property
    def item(self) -> Item:
        return self.attempt.items[self.index]

    def _set_visible(self, *, question: bool) -> None:
        shown = _SHOW if question else _HIDE
        self.prompt.layout.display = shown
        self.check_button.layout.display = shown
        self.next_button.layout.display = shown
        is_choice = question and self.item.kind is Kind.CHOICE
        self.choices.layout.display = _SHOW if is_choice else _HIDE
        self.number.layout.display = _SHOW if question and not is_choice else _HIDE

    def _show(self) -> None:
        item, a = self.item, self.attempt
        self.title.value = (f"<b>Quick test</b> (seed {a.seed}): question {self.index + 1} of "
                            f"{a.total} &middot; <i>{html.escape(item.concept.label)}</i>")
        self.progress.value = len(a.results)
        hint = ("" if item.kind is Kind.CHOICE else
                f"<br><small><i>Answer with {html.escape(item.hint)}.</i></small>")
        self.prompt.value = f"<p>{html.escape(item.prompt)}{hint}</p>"
        self.number.placeholder = item.hint
        self.choices.options = [(f"{LETTERS[i]}) {c}", LETTERS[i])
                                for i, c in enumerate(item.choices)]
        self.choices.value = None
        self.number.value = ""
        self.choices.disabled = self.number.disabled = False
        self.check_button.disabled = False
        self.next_button.disabled = True
        last = self.index == a.total - 1
        self.next_button.description = "Finish" if last else "Next"
        self.feedback.value = ""
        self._set_visible(question=True)

    # ------------------------------------------------------------ handlers

    def _given(self) -> str | None:
        if self.item.kind is Kind.CHOICE:
            return self.choices.value
        return self.number.value if self.number.value.strip() else None

    def _on_check(self, _button: widgets.Button | None = None) -> None:
        given = self._given()
        if given is None:
            what = "pick one of the choices" if self.item.kind is Kind.CHOICE else "type a number"
            self.feedback.value = f"<span style='color:#b26b00'>First {what}.</span>"
            return
        result = self.attempt.answer(self.index, given)
        self.feedback.value = _feedback_html(result)
        if self.save:  # so a kernel restart resumes here
            self._store_call(self.store.save_current, self.attempt, source="widget")
        self.progress.value = len(self.attempt.results)
        self.choices.disabled = self.number.disabled = True
        self.check_button.disabled = True
        self.next_button.disabled = False

    def _on_next(self, _button: widgets.Button | None = None) -> None:
        if self.item.id not in self.attempt.results:
            return  # Next is disabled until Check; ignore stray clicks
        if self.index + 1 < self.attempt.total:
            self.index += 1
            self._show()
        else:
            self._finish()

    def _finish(self) -> None:
        a = self.attempt
        self._set_visible(question=False)
        self.feedback.value = ""
        self.title.value = f"<b>Quick test</b> (seed {a.seed}): finished"
        verdict = ("<b style='color:#1a7f37'>Passed</b>" if a.passed
                   else "<b style='color:#b3261e'>Not passed yet</b>")
        missed = [r for r in a.ordered_results() if not r.correct]
        review = "".join(f"<li>{html.escape(r.id)} ({html.escape(r.concept.label)})</li>"
                         for r in missed)
        lines = [f"<h3>Score: {a.score}/{a.total} ({a.percent:g}%)</h3>",
                 f"<p>{verdict}: the pass mark is {a.pass_percent}%.</p>"]
        if review:
            lines.append(f"<p>Worth another look:</p><ul>{review}</ul>")
        if self.save:
            try:
                self.saved = self.store.record(a, source="widget")
                best = self.saved.get("best") or {}
                lines.append(f"<p>Progress saved ({len(self.saved['attempts'])} attempt(s)); "
                             f"best so far {best.get('score')}/{best.get('total')}.</p>")
            except OSError as exc:
                lines.append(f"<p><i>Could not save progress to {html.escape(str(self.store.path))}"
                             f": {html.escape(str(exc))}</i></p>")
            if self.store.warning:
                lines.append(f"<p><i>{html.escape(self.store.warning)}</i></p>")
        self.summary.value = "".join(lines)
        self.restart_button.layout.display = _SHOW


def _feedback_html(r: Result) -> str:
    if r.correct:
        head = "<b style='color:#1a7f37'>Correct.</b>"
    else:
        why = f" ({html.escape(r.message)})" if r.message else ""
        head = (f"<b style='color:#b3261e'>Not quite{why}.</b> Expected: "
                f"{html.escape(r.expected)}")
    return f"<p>{head}</p><p>{html.escape(r.explanation)}</p>"


def quiz_widget(seed: int | None = None, *, save: bool = True, resume: bool = True,
                store: ProgressStore | str | os.PathLike[str] | None = None) -> widgets.Widget:
    """The quick test for a notebook cell: ten questions, pass at 70%, progress saved.

    ``seed`` reproduces an attempt (``None`` draws a fresh one); ``store`` overrides where
    progress goes (default ``$LABKIT_HOME/quiz.json``); ``save=False`` keeps nothing.
    Every answer is saved as it is checked; with ``resume`` (default) the attempt in
    progress comes back after a kernel restart, and ``labkit quiz`` resumes it too.
    The returned box carries its :class:`QuizPanel` as ``.panel``.
    """
    panel = QuizPanel(seed, store=store, save=save, resume=resume)
    box = panel.box
    box.panel = panel  # type: ignore[attr-defined]
    return box
