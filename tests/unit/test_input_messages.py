"""Inputs refused with labkit's own message (issue 36, item 4): the value, the rule it
breaks and a valid example, exit 2, before any process (or nbgrader) starts. A world size
no machine holds names world_size's rule, not a derived timeout; a value that starts with
'-' reaches labkit's rule instead of argparse's "expected one argument"; a warmup longer
than the schedule, a cell timeout of nan / -1 / 0 and a deleted working directory are
refused up front."""

from __future__ import annotations

import pytest

import labkit
from labkit.base.errors import ConfigError
from labkit.cli import main

pytestmark = pytest.mark.lesson00


def test_a_huge_world_size_names_the_world_size_rule(capsys, no_process_may_start):
    """`--world-size 1000000000` used to answer with `timeout_s (30000000000.0)`, a value
    derived from the world size that the user never typed."""
    assert main(["run", "ddp", "--world-size", "1000000000", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "world_size (1000000000) must be >= 1 and <= 64 ranks on one machine" in err, err
    assert "timeout_s" not in err, err
    with pytest.raises(ConfigError, match=r"world_size \(1000000000\)") as raised:
        labkit.run(strategy="ddp", world_size=10**9)
    assert "timeout_s" not in str(raised.value)


def test_a_huge_world_size_in_json_mode_is_one_config_error(capsys, no_process_may_start):
    assert main(["run", "ddp", "--world-size", "1000000000", "--json"]) == 2
    out = capsys.readouterr().out
    assert '"kind": "config"' in out and "world_size (1000000000)" in out, out
    assert "timeout_s" not in out, out


@pytest.mark.parametrize("flags, fragment", [
    (["--inject-fault", "-1:3:raise"], "inject_fault rank (-1) must be >= 0"),
    (["--link", "-5gbit,1ms"],
     "link rate '-5gbit' (-5e+09 bit/s) must be between 1 Mbit/s and 10 Gbit/s"),
    (["--link", "200mbit,-1ms"], "link latency '-1ms' must be >= 0"),
    (["--checkpoint-every", "-2"], "checkpoint_every (-2) must be >= 0"),
])
def test_a_value_starting_with_a_dash_gets_labkits_rule(flags, fragment, capsys,
                                                        no_process_may_start):
    assert main(["run", "ddp", *flags, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert "expected one argument" not in err, err


def test_dash_values_joins_only_values_never_flags() -> None:
    from labkit.config.flags import dash_values, run_flags_parser

    parser = run_flags_parser("ddp")
    assert dash_values(["ddp", "--inject-fault", "-1:3:raise"], parser) == [
        "ddp", "--inject-fault=-1:3:raise"]
    # a flag after a flag is still a flag (a forgotten value stays argparse's error)
    assert dash_values(["ddp", "--trace", "--json"], parser) == ["ddp", "--trace", "--json"]
    assert dash_values(["ddp", "--json", "-x"], parser) == ["ddp", "--json", "-x"]
    assert dash_values(["ddp", "--", "--link", "-5"], parser) == ["ddp", "--", "--link", "-5"]


def test_a_forgotten_value_is_still_argparses_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "ddp", "--trace", "--json"])
    assert exit_.value.code == 2
    assert "--trace: expected one argument" in capsys.readouterr().err


@pytest.mark.parametrize("flags, fragment", [
    (["--warmup-steps", "100", "--total-steps", "10"],
     "--warmup-steps (100) must be less than --total-steps (10)"),
    (["--warmup-steps", "10", "--total-steps", "10", "--step", "3"],
     "--warmup-steps (10) must be less than --total-steps (10)"),
    (["--warmup-steps", "-5"], "--warmup-steps (-5) must be >= 0"),
])
def test_calc_lr_refuses_a_warmup_longer_than_the_schedule(flags, fragment, capsys) -> None:
    assert main(["calc", "lr", "--per-device-batch", "32", "--devices", "8", "--base-lr",
                 "0.1", *flags]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "e.g." in err, err


@pytest.mark.parametrize("value, fragment", [
    ("nan", "cell_timeout (nan) must be a finite number > 0 and <= 86400 seconds"),
    ("-1", "cell_timeout (-1.0) must be > 0 and <= 86400 seconds"),
    ("0", "cell_timeout (0.0) must be > 0"),
    ("inf", "cell_timeout (inf) must be a finite number"),
])
def test_submit_refuses_a_cell_timeout_before_nbgrader_starts(value, fragment, capsys,
                                                             monkeypatch) -> None:
    from labkit.grading import course

    def no_nbgrader(*args, **kwargs):
        raise AssertionError("nbgrader started for a bad --cell-timeout")

    monkeypatch.setattr(course, "nbgrader", no_nbgrader)
    monkeypatch.setattr(course, "release", no_nbgrader)
    assert main(["submit", "ps1_numbers", "--cell-timeout", value]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "e.g. cell_timeout=60" in err, err


@pytest.fixture
def deleted_cwd(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()


def test_a_deleted_working_directory_is_named_not_a_traceback(deleted_cwd, capsys,
                                                            no_process_may_start):
    assert main(["run", "ddp", "--steps", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the working directory no longer exists" in err and "e.g. cd ~" in err, err
    with pytest.raises(ConfigError, match="the working directory no longer exists"):
        labkit.launch(lambda ctx: None, 2)
