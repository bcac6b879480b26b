"""torchrun --max-restarts brings training back after a worker is killed (one host)."""

from __future__ import annotations

from pathlib import Path

import pytest

import labkit
from labkit.launchers.elastic import run_elastic

pytestmark = [pytest.mark.distributed, pytest.mark.lesson07]


def test_torchrun_restarts_and_resumes_to_the_same_weights(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str]
                                                          ) -> None:
    """... says what it waits for (seconds of torchrun: issue 39, item 3), and leaves
    nothing in the caller's temp dir (torchrun's torchelastic_* dirs went to /tmp, one per
    run, before issue 25)."""
    import tempfile

    caller_tmp = tmp_path / "tmp"
    caller_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(caller_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    report = run_elastic(checkpoint_dir=tmp_path / "ck", steps=10, nproc=2, max_restarts=2,
                         checkpoint_every=2, inject_fault="1:5:kill", timeout_s=240,
                         progress=True)
    out, err = capfd.readouterr()
    assert "torchrun: 2 rank(s), 10 steps, up to 2 restart(s)..." in err and out == "", err
    assert report["attempt"] >= 1, report["log"][-2000:]
    assert report["resumed_from_step"] == 4, report
    ref = labkit.run(strategy="ddp", world_size=2, steps=10, progress=False,
                     threads_per_rank=1, timeout_s=90)
    assert report["params_sha256"] == ref.params_sha256
    assert sorted(p.name for p in caller_tmp.iterdir()) == [], "temp files left behind"


def test_a_wrong_progress_is_named_before_torchrun_starts(tmp_path: Path) -> None:
    from labkit.base.errors import ConfigError

    with pytest.raises(ConfigError, match=r"progress \('yes'\) must be True, False or None"):
        run_elastic(checkpoint_dir=tmp_path, progress="yes")  # type: ignore[arg-type]
