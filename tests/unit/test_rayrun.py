"""The Ray launcher's decisions without starting Ray: which rank a failed run is blamed on,
config validation of the launcher, and that importing labkit's Ray pieces imports no Ray."""

from __future__ import annotations

import subprocess
import sys

import pytest

from labkit.base.errors import ConfigError, RankFailure, RunTimeout
from labkit.config.run import RunConfig
from labkit.launchers.ray.launcher import _failure

pytestmark = pytest.mark.lesson12
CONFIG = RunConfig(strategy="ddp", world_size=3, launcher="ray")


class _GroupError(Exception):
    """Stands for Ray Train's WorkerGroupError: rank -> the exception Ray saw."""

    def __init__(self, worker_failures: dict[int, Exception]):
        super().__init__("workers failed")
        self.worker_failures = worker_failures


def test_a_real_exception_wins_over_the_echoes_it_caused():
    errors = [(1, RankFailure(0, "exception", "RuntimeError: Connection closed by peer")),
              (2, RankFailure(2, "exception", "RuntimeError: injected fault"))]
    err = _failure(CONFIG, _GroupError({}), {}, errors)
    assert err.failure.rank == 2 and [f.rank for f in err.others] == [0]


def test_a_silent_death_is_named_by_the_rank_ray_saw_die():
    errors = [(1, RankFailure(0, "exception", "RuntimeError: Connection reset by peer"))]
    err = _failure(CONFIG, _GroupError({1: RuntimeError("actor died"), 0: RuntimeError("x")}),
                   {}, errors)
    assert (err.failure.rank, err.failure.kind) == (1, "exit")
    assert "actor died" in err.failure.message


def test_a_timeout_names_the_rank_that_hung_outside_communication():
    errors = [(1, RankFailure(1, "timeout", "rank 1 ..., waiting in communication")),
              (2, RankFailure(0, "timeout", "rank 0 ..., outside any communication call"))]
    err = _failure(CONFIG, _GroupError({}), {}, errors)
    assert isinstance(err, RunTimeout) and err.failure.rank == 0
    assert "--- rank 1 ---" in err.failure.traceback


def test_a_failure_with_nothing_reported_still_says_what_ray_said():
    err = _failure(CONFIG, ValueError("placement failed"), {}, [])
    assert err.failure.rank is None and "placement failed" in err.failure.message


def test_launcher_must_be_labkit_or_ray():
    with pytest.raises(ConfigError, match="launcher 'slurm' must be one of labkit, ray"):
        RunConfig(strategy="ddp", launcher="slurm")


def test_importing_labkits_ray_modules_imports_no_ray():
    code = ("import sys, labkit.launchers.ray, labkit.launchers.ray.launcher, labkit.lessons.ray_tasks, "
            "labkit.lessons.ray_tune, labkit.lessons.ray_faults\n"
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
