"""The surfaces a student touches without starting ranks: plots, the viewer widget, the
doctor, the CLI's input errors, and how a failure is rendered in a notebook."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.analysis.plots import COLORS, plot_timeline, plot_timelines
from labkit.base.errors import RankFailure, RunFailed
from labkit.cli import main
from tests.unit.test_timeline import two_rank_timeline

pytestmark = pytest.mark.lesson00


def test_plot_timeline_draws_one_bar_per_compute_and_comm_span():
    fig = plot_timeline(two_rank_timeline())
    ax = fig.axes[0]
    bars = [c for c in ax.collections]  # broken_barh -> one collection per span
    assert len(bars) == 7  # 3 compute + 4 comm spans; step spans are not drawn
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    colors = {tuple(round(x, 3) for x in c.get_facecolor()[0][:3]) for c in bars}
    assert len(colors) == 5  # forward, backward, all_reduce, send, recv
    assert "µs" in ax.get_xlabel() or "ms" in ax.get_xlabel()


def test_plot_timelines_stacks_runs_on_one_scale():
    tl = two_rank_timeline()
    fig = plot_timelines({"a": tl, "b": tl})
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["a", "b"]


def test_every_op_has_a_colour():
    from labkit.base.events import Op

    assert set(COLORS) == set(Op)


def test_timeline_viewer_redraws_on_slider_change():
    from labkit.analysis.timeline import Timeline
    from labkit.base.events import Event
    from labkit.widgets.timeline import timeline_viewer

    base = two_rank_timeline()
    later = [Event(e.rank, e.lane, e.op, e.start_ns + 1000, e.dur_ns // 2, step=1)
             for e in base.events]
    box = timeline_viewer(Timeline(base.events + later, 2))
    slider, stats = box.children[0].children[0], box.children[1]
    slider.value = (0, 0)
    first = stats.value
    slider.value = (1, 1)
    assert "steps 0–0" in first and "steps 1–1" in stats.value and first != stats.value


def test_doctor_reports_cores_backends_and_packages():
    from labkit.doctor import doctor

    rep = doctor()
    assert rep.cpu_cores >= 1 and rep.backends["gloo"] and "ddp" in rep.strategies
    assert "jupyterlab" in rep.packages and "CPU cores" in str(rep)


@pytest.mark.parametrize("first", ["package", "module"])
def test_labkit_doctor_is_callable_whichever_import_came_first(first):
    """Notebook 00 calls ``labkit.doctor()``; the CLI imports ``labkit.doctor`` the module.
    Either order leaves one name that both calls and holds the module's parts."""
    code = ("import labkit.doctor, labkit" if first == "module" else "import labkit") + (
        "; r = labkit.doctor(); import labkit.doctor as m; from labkit import doctor as d"
        "; assert d is m and r.cpu_cores >= 1 and callable(d.doctor) and d.SLOW_IMPORT_NOTE")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_doctor_names_the_parsers_every_jsonschema_import_builds(monkeypatch):
    """rfc3987-syntax installed (as jupyter-events brings it) is named with its cost and the
    command that removes it; absent (as ``make setup`` leaves it), nothing is said."""
    import importlib.util

    from labkit import doctor as doctor_module

    real = importlib.util.find_spec
    for installed in (True, False):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, _i=installed: (
            (real("json") if _i else None) if name == "rfc3987_syntax" else real(name, *a)))
        notes = doctor_module.doctor().notes
        assert (doctor_module.SLOW_IMPORT_NOTE in notes) is installed
    assert "pip uninstall rfc3987-syntax" in doctor_module.SLOW_IMPORT_NOTE


def test_doctor_clean_removes_a_dead_runs_directory_and_leaves_a_live_one(tmp_path,
                                                                        monkeypatch):
    """A run directory whose lock nobody holds (its kernel was killed) goes; a held one stays."""
    import tempfile

    from labkit.doctor import doctor
    from labkit.launchers import rundirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, live = tmp_path / f"{rundirs.PREFIX}dead", tmp_path / f"{rundirs.PREFIX}live"
    for d in (dead, live):
        d.mkdir()
        (d / rundirs.OWNER).touch()
    with rundirs.hold(live):
        rep = doctor(clean=True)
    assert rep.runs_cleaned is not None and rep.runs_cleaned["run_dirs"] == [str(dead)]
    assert not dead.exists() and live.exists()
    assert "1 run dir(s) removed" in str(rep)
    assert doctor().runs_cleaned is None


def test_cli_doctor_json(capsys):
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cpu_cores"] >= 1


def test_cli_list_names_strategies(capsys):
    assert main(["list"]) == 0
    assert "ddp" in capsys.readouterr().out


def test_cli_unknown_strategy_and_flags_exit_2(capsys):
    assert main(["run", "nope"]) == 2
    assert "strategy 'nope' is not registered" in capsys.readouterr().err
    assert main(["run", "ddp", "--bogus-flag", "1"]) == 2
    assert "--bogus-flag" in capsys.readouterr().err


def test_cli_strategy_help_lists_its_options(capsys):
    assert main(["run", "ddp", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--bucket-cap-mb" in out and "--world-size" in out


def test_failure_renders_as_the_failing_ranks_block_in_notebooks():
    err = RunFailed(RankFailure(2, "exception", "ValueError: bad", "Traceback...\nValueError"),
                    [RankFailure(0, "exception", "Connection closed by peer")])
    text = "\n".join(err._render_traceback_())
    assert "rank 2 failed (exception)" in text and "ValueError: bad" in text
    assert "Connection closed" not in text and "1 other rank(s)" in text


def test_cli_run_summary_rounds_numbers_and_ends_with_the_note():
    """`labkit run` prints floats to 4 significant digits, whole numbers without a decimal
    point, lists of numbers element by element, and a strategy's note last."""
    from types import SimpleNamespace

    from labkit.analysis.report import describe

    result = SimpleNamespace(losses=[2.5, 2.25], trace_path=None, params_sha256=None, metrics={
        "bubble_fraction": 0.4951834290929521, "bubble_fraction_per_rank": [0.66421, 0.49],
        "p2p_bytes_per_step": 32768.0, "schedule": "zb", "note": "actions are short"})
    text = describe(result)
    lines = text.splitlines()
    assert "  bubble_fraction 0.4952" in lines
    assert "  bubble_fraction_per_rank [0.6642, 0.49]" in lines
    assert "  p2p_bytes_per_step 32768" in lines
    assert lines[-1] == "  note: actions are short"
    assert not any(line.startswith("  params_sha256") for line in lines)  # no hash, no line
