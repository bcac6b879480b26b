"""`labkit run` and `labkit.launch` refuse bad input before any process starts (issue 14):
exit code 2 and a message naming the value and the rule, for every input students were
seen to type; output files are checked before the run, so a run never finishes only to
lose its results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import labkit
from labkit.base.errors import ConfigError
from labkit.cli import main

pytestmark = pytest.mark.lesson00


@pytest.mark.parametrize("flags, fragment", [
    (["--timeout", "inf"], "timeout_s (inf) must be a finite number > 0 and <= 604800 seconds"),
    (["--timeout", "nan"], "timeout_s (nan) must be a finite number"),
    (["--width", "1000000"], "model.width (1000000) must be >= 1 and <= 65536"),
    (["--seed", "1e20"], "seed (1e+20) must be an integer >= 0 and <= 4294967295"),
    (["--seed", "1.5"], "seed (1.5) must be an integer"),
    (["--lr", "inf"], "lr (inf) must be a finite number > 0 and <= 100"),
    (["--world-size", "2.0"], "world_size (2.0) must be an integer >= 1, not float"),
    (["--world-size", "2.5"], "world_size (2.5) must be an integer"),
    (["--world-size", "65"], "world_size (65) must be >= 1 and <= 64 ranks on one machine"),
    (["--steps", "2.5"], "steps (2.5) must be an integer"),
    (["--batch-size", "0"], "batch_size (0) must be >= 1"),
    (["--depth", "1e3"], "model.depth (1000.0) must be an integer"),
])
def test_bad_numbers_exit_2_naming_value_and_rule(flags, fragment, capsys, no_process_may_start):
    assert main(["run", "ddp", *flags, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err


def test_a_flag_that_is_not_a_number_exits_2_naming_it(capsys, no_process_may_start):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "ddp", "--seed", "abc"])
    assert exit_.value.code == 2
    assert "--seed: 'abc' is not a number" in capsys.readouterr().err


def _unwritable_targets(tmp_path: Path) -> list[tuple[str, str]]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return [(str(tmp_path), "is a directory; give a file name"),
            ("/proc/x.json", "cannot be written"),
            (str(a_file / "sub" / "x.json"), "cannot be created")]


@pytest.mark.parametrize("flag", ["--trace", "--timeline"])
def test_output_paths_are_checked_before_the_run(flag, tmp_path, capsys, no_process_may_start):
    for path, fragment in _unwritable_targets(tmp_path):
        assert main(["run", "ddp", flag, path, "--no-progress"]) == 2, path
        err = capsys.readouterr().err
        assert f"{flag} {path!r}" in err and fragment in err, err


def test_the_output_check_keeps_an_existing_file_and_creates_missing_dirs(tmp_path):
    from labkit.launchers.output import output_problem

    existing = tmp_path / "old.json"
    existing.write_text("keep me")
    assert output_problem("--trace", str(existing)) is None
    assert existing.read_text() == "keep me"
    fresh = tmp_path / "new" / "deeper" / "run.json"
    assert output_problem("--trace", str(fresh)) is None
    assert fresh.parent.is_dir() and not fresh.exists()


@pytest.mark.parametrize("args, kwargs, fragment", [
    ((2.0,), {}, "world_size (2.0) must be a whole number of ranks"),
    ((2.5,), {}, "an int from 1 to 64 (ranks on one machine), not a float; e.g. "
                 "labkit.launch(fn, 2)"),
    ((True,), {}, "world_size (True) must be a whole number of ranks"),
    (("2",), {}, "world_size ('2') must be a whole number of ranks"),
    ((65,), {}, "world_size (65) must be >= 1 and <= 64 ranks on one machine"),
    ((2,), {"timeout_s": math.inf}, "timeout_s (inf) must be a finite number"),
    ((2,), {"seed": 1.5}, "seed (1.5) must be an integer"),
    ((2,), {"threads_per_rank": 0}, "threads_per_rank (0) must be >= 1"),
    ((2,), {"trace": "no"}, "trace ('no') must be True or False"),
    ((2,), {"backend": "mpi"}, "backend 'mpi' must be 'gloo' or 'nccl'"),
])
def test_launch_checks_its_arguments_before_starting(args, kwargs, fragment,
                                                     no_process_may_start):
    with pytest.raises(ConfigError) as err:
        labkit.launch(lambda ctx: None, *args, **kwargs)
    assert fragment in str(err.value), str(err.value)


def test_run_refuses_more_ranks_than_one_machine_takes(no_process_may_start):
    with pytest.raises(ConfigError, match=r"world_size \(100\) must be >= 1 and <= 64"):
        labkit.run(strategy="ddp", world_size=100)


def test_a_diverged_run_says_so(monkeypatch):
    """A finite but too large learning rate can still diverge: the summary says so."""
    from labkit.analysis.report import describe
    from labkit.analysis.timeline import Timeline
    from labkit.config.run import RunConfig
    from labkit.launchers.results import RunResult

    cfg = RunConfig(strategy="ddp", lr=50.0)
    result = RunResult(config=cfg, backend="gloo", timeline=Timeline([], 2),
                       losses=[2.3, 1e30, math.nan], metrics={}, wall_s=1.0, params_sha256=None)
    assert "the loss is nan from step 2 on: training diverged" in describe(result)


def test_the_summary_names_skipped_and_moved_checkpoints():
    from labkit.analysis.report import describe
    from labkit.analysis.timeline import Timeline
    from labkit.config.run import RunConfig
    from labkit.launchers.results import RunResult

    skipped = {"checkpoint": "step_00000006", "file": "__1_0.distcp", "check": "sha256",
               "detail": "its bytes changed since the save", "resumed_from_step": 4}
    result = RunResult(config=RunConfig(strategy="ddp"), backend="gloo",
                       timeline=Timeline([], 2), losses=[1.0], wall_s=1.0, params_sha256=None,
                       metrics={"checkpoint_fallback": [skipped],
                                "checkpoints_moved_aside": ["step_00000006.corrupt"]})
    text = describe(result)
    assert ("skipped checkpoint step_00000006: __1_0.distcp failed the sha256 check (its bytes "
            "changed since the save); resumed from step 4") in text
    assert "renamed step_00000006.corrupt" in text
