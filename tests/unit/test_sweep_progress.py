"""A lesson's sweep of runs shows one progress bar over the sweep (issue 39, item 3): its runs
stay quiet (``progress=False``), the bar counts them on stderr, and stdout stays the
lesson's own. Runs are stand-ins here: what is pinned is who shows what, where."""

from __future__ import annotations

import io
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from labkit.base import progress
from labkit.base.progress import each


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (where a bar can redraw)."""

    def isatty(self) -> bool:
        return True


def test_each_names_every_item_on_a_plain_line_when_asked_off_a_terminal(capsys) -> None:
    assert list(each([1, 2, 4], "weak scaling", name=lambda n: f"{n} rank(s)",
                     progress=True)) == [1, 2, 4]
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["weak scaling: 1/3 1 rank(s)", "weak scaling: 2/3 2 rank(s)",
                                "weak scaling: 3/3 4 rank(s)"]


def test_each_is_silent_off_a_terminal_unless_asked_and_never_when_refused(capsys) -> None:
    assert list(each("ab", "sweep")) == ["a", "b"]
    assert list(each("ab", "sweep", progress=False)) == ["a", "b"]
    assert capsys.readouterr() == ("", "")


def test_each_draws_a_bar_on_a_terminal_once_the_sweep_lasts(monkeypatch, capsys) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress, "SWEEP_DELAY_S", 0.0)
    assert list(each(["none", "fp16"], "compression methods")) == ["none", "fp16"]
    shown = terminal.getvalue()  # tqdm redraws at most every 0.1 s: the bar, its total
    assert "compression methods" in shown and "/2 " in shown
    assert capsys.readouterr().out == ""


def _fake_run(calls: list[dict[str, Any]]) -> Any:
    def run(**kwargs: Any) -> Any:
        calls.append(kwargs)
        method = kwargs["options"]["method"]
        return SimpleNamespace(
            metrics={"wire_bytes_per_step": [100.0], "predicted_wire_bytes": 100.0,
                     "compression_ratio": 1.0 if method == "none" else 2.0},
            step_time_s=0.01, losses=[1.0, 0.5])
    return run


@pytest.mark.lesson06
def test_a_lesson_sweep_counts_its_runs_on_one_bar_and_its_runs_stay_quiet(monkeypatch,
                                                                            capsys) -> None:
    """``compare_compression`` runs each method once: one line per run from the sweep's bar
    (asked for here, off a terminal), none from the runs themselves, nothing on stdout."""
    import labkit
    from labkit.lessons.compression import compare_compression

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(labkit, "run", _fake_run(calls))
    monkeypatch.setattr(progress, "interactive", lambda: False)
    real_each = progress.each

    def asked(*args: Any, **kwargs: Any) -> Any:
        return real_each(*args, **{**kwargs, "progress": True})

    monkeypatch.setattr("labkit.lessons.compression.each", asked)
    out = compare_compression(("none", "fp16", "topk"))
    assert [row["method"] for row in out["rows"]] == ["none", "fp16", "topk"]
    assert all(call["progress"] is False for call in calls)
    stdout, stderr = capsys.readouterr()
    assert stdout == ""
    assert stderr.splitlines() == ["compression methods: 1/3 none",
                                   "compression methods: 2/3 fp16",
                                   "compression methods: 3/3 topk"]


def test_a_process_that_only_imported_ipykernel_is_no_kernel(monkeypatch) -> None:
    """A test worker that drove a notebook has ``ipykernel`` imported but is no kernel: its
    progress stays plain lines (the full suite failed five progress tests this way)."""
    import io

    import ipykernel  # noqa: F401

    from labkit.base import progress

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert "ipykernel" in __import__("sys").modules
    assert not progress.in_kernel() and not progress.interactive()


def _train_a_bit(ctx: Any) -> None:
    """A launched function's stand-in (never run: the executor below fakes the ranks)."""


class _Stop(Exception):
    pass


def _launch_that_reports(steps: list[int]) -> Any:
    """An executor whose ranks report ``steps`` done, then fail (no ranks start); its watch
    loop calls back every 0.2 s (a bar redraws at most every 0.1 s)."""
    def execute(job: Any, world_size: int, timeout_s: float, on_progress: Any) -> Any:
        for done in steps:
            time.sleep(0.15)
            if on_progress is not None:
                on_progress(done)
        raise _Stop
    return execute


def _launch(progress_: bool | None, steps: list[int]) -> None:
    from labkit.launchers.jobs import launch_job
    from labkit.launchers.runner import launch_with

    job = launch_job(_train_a_bit, 2, (), backend="gloo", timeout_s=10, seed=0,
                     threads_per_rank=1, trace=False, progress=progress_)
    with pytest.raises(_Stop):
        launch_with(job, 2, _launch_that_reports(steps), progress_)


def test_a_launch_asked_for_progress_shows_its_time_and_steps_and_stdout_stays_clean(capsys
                                                                                    ) -> None:
    _launch(True, [0, 0, 3])
    out, err = capsys.readouterr()
    assert out == ""
    assert "_train_a_bit on 2 ranks: 00:00" in err and ", 3 steps" in err, err


def test_a_launch_off_a_terminal_or_refused_shows_nothing(capsys) -> None:
    _launch(None, [0, 5])
    _launch(False, [0, 5])
    assert capsys.readouterr() == ("", "")


def test_a_launchs_progress_is_checked_before_any_rank_starts() -> None:
    import labkit
    from labkit.base.errors import ConfigError

    with pytest.raises(ConfigError, match=r"progress \('yes'\) must be True, False or None"):
        labkit.launch(_train_a_bit, 2, progress="yes")  # type: ignore[arg-type]


def test_a_bar_shows_on_time_and_its_clock_moves_while_no_step_ends(monkeypatch) -> None:
    """The first run of a sweep may last longer than the bar's delay: the ticker shows the
    bar once the delay has passed and redraws its clock, before any step ends."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress.Progress("bucket sizes", total=4, unit="run", delay=0.3):
        time.sleep(0.2)
        assert terminal.getvalue() == ""  # not yet: a short wait shows nothing
        time.sleep(1.5)
        shown = terminal.getvalue()
    assert "bucket sizes" in shown and "0/4" in shown, shown
    assert "00:01" in shown, shown  # redrawn a second in, with no step done
