"""A run never trains only to lose its result (issue 36, item 2): every output path is
checked before any process starts (a checkpoint directory on /proc, on a regular file, on
a symlink loop, on a read-only mount; a trace on a full disk), a result file is written
all at once (a full disk leaves no 0-byte file), and the calibration cache is best effort
(a read-only HOME costs a warning, never the run's result)."""

from __future__ import annotations

import errno
import subprocess
import sys
import time
from pathlib import Path

import pytest

import labkit
from labkit.analysis import calibrate as cal
from labkit.base import files
from labkit.base.errors import ConfigError
from labkit.cli import main

pytestmark = pytest.mark.lesson00


def _bad_checkpoint_dirs(tmp_path: Path) -> list[tuple[str, str]]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    loop_a, loop_b = tmp_path / "loop_a", tmp_path / "loop_b"
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    return [("/proc/nope", "cannot be created"),
            (str(a_file), "is a regular file, not a directory"),
            (str(loop_a), "is a symbolic link that leads nowhere"),
            (str(a_file / "ckpt"), "cannot be created")]


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_before_the_run(
        tmp_path, capsys, no_process_may_start):
    """`labkit run ddp --checkpoint-dir X --checkpoint-every 1`: exit 2 naming the value,
    the rule and an example, instead of a rank traceback at the first save."""
    for path, fragment in _bad_checkpoint_dirs(tmp_path):
        assert main(["run", "ddp", "--checkpoint-dir", path, "--checkpoint-every", "1",
                     "--no-progress"]) == 2, path
        err = capsys.readouterr().err
        assert f"checkpoint_dir {path!r} {fragment}" in err, err
        assert "e.g. checkpoint_dir='ckpt'" in err, err


def test_labkit_run_refuses_an_unwritable_checkpoint_dir_too(tmp_path, no_process_may_start):
    for path, fragment in _bad_checkpoint_dirs(tmp_path):
        with pytest.raises(ConfigError, match="checkpoint_dir") as err:
            labkit.run(strategy="ddp", options={"checkpoint_dir": path, "checkpoint_every": 1},
                       progress=False)
        assert fragment in str(err.value)


def test_a_read_only_mount_is_found_by_trying_a_write(tmp_path, monkeypatch, capsys,
                                                      no_process_may_start):
    """Root passes every permission bit, so the check writes a file: a read-only mount
    (EROFS on the first write) is refused up front."""
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    path = str(tmp_path / "ckpt")
    assert main(["run", "ddp", "--checkpoint-dir", path, "--checkpoint-every", "1"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint_dir {path!r} cannot be written to (Read-only file system)" in err, err


def test_a_checkpoint_dir_is_checked_only_when_the_run_saves(no_process_may_start):
    from labkit.config.run import RunConfig
    from labkit.launchers.jobs import checkpoint_dir_problem

    config = RunConfig(strategy="ddp", options={"checkpoint_dir": "/proc/nope"})
    assert checkpoint_dir_problem(config) is None  # checkpoint_every=0: nothing is written


def test_a_trace_onto_a_full_disk_is_refused_before_the_run(tmp_path, monkeypatch, capsys,
                                                           no_process_may_start):
    monkeypatch.setattr(files, "free_bytes", lambda path: 4096)
    path = str(tmp_path / "run.json")
    assert main(["run", "ddp", "--trace", path, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--trace {path!r}" in err and "is on a full disk (4096 bytes free" in err, err
    assert not Path(path).exists()


_WRITE_ON_A_FULL_DISK = """
import resource, signal, sys
from labkit.analysis.timeline import Timeline
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (8, 8))  # every write past 8 bytes: EFBIG
try:
    getattr(Timeline([], 2), sys.argv[1])(sys.argv[2])
except OSError as exc:
    print("failed:", exc.errno)
"""


@pytest.mark.parametrize("method", ["to_chrome", "save"])
def test_a_result_file_that_cannot_be_finished_leaves_no_empty_file(method, tmp_path):
    """A disk that fills up during the write: the trace / timeline is not left behind as a
    0-byte (or half) file that a viewer would take for a run's output."""
    path = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "-c", _WRITE_ON_A_FULL_DISK, method, str(path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert f"failed: {errno.EFBIG}" in proc.stdout, proc.stdout + proc.stderr
    assert not path.exists(), f"{path.stat().st_size}-byte file left behind"
    assert list(tmp_path.iterdir()) == []


def _measured() -> dict:
    return {"rates": {"256x256x256": 5e10}, "spreads": {"256x256x256": 0.0},
            "others_cores": 0.0, "load": 0.1, "device": "cpu", "name": "test cpu",
            "threads": 2, "dtype": "float32", "measured_at": time.time()}


@pytest.mark.parametrize("home_is", ["LABKIT_CACHE", "HOME"])
def test_an_unwritable_cache_warns_and_keeps_the_peak(home_is, tmp_path, monkeypatch):
    """A read-only HOME (here: HOME and LABKIT_CACHE under a regular file, which not even
    root can write into) used to end every run in ``OSError`` after it trained."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    if home_is == "HOME":
        monkeypatch.delenv("LABKIT_CACHE", raising=False)
        monkeypatch.setenv("HOME", str(blocker / "home"))
    else:
        monkeypatch.setenv("LABKIT_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(cal, "_run_measurement", lambda *a, **k: _measured())
    with pytest.warns(RuntimeWarning, match="calibration cache .* cannot be created"):
        peak = cal.calibrate("cpu", threads=2, shapes=[])
    assert peak is not None and peak["peak_flops_per_s"] == 5e10


def test_a_cache_that_cannot_be_written_warns_and_keeps_the_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(cal, "_run_measurement", lambda *a, **k: _measured())

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("labkit.base.cache.write_json_atomic", full)  # the one keyed cache
    with pytest.warns(RuntimeWarning, match="cannot be written .No space left on device"):
        peak = cal.calibrate("cpu", threads=2, shapes=[])
    assert peak is not None and peak["fresh"]


def test_an_atomic_result_file_keeps_the_permissions_of_a_plain_write(tmp_path):
    """The temporary file of an atomic write is 0600; the trace a student shares is not."""
    import os

    from labkit.analysis.timeline import Timeline

    old = os.umask(0o022)
    try:
        Timeline([], 2).to_chrome(tmp_path / "run.json")
    finally:
        os.umask(old)
    assert (tmp_path / "run.json").stat().st_mode & 0o777 == 0o644
