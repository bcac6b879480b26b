"""Checkpoint integrity without processes (issue 14): the manifest written before the
commit marker catches a flipped byte in any file, a truncated or missing file, a deleted
or damaged marker; the resume takes the newest checkpoint that passes and names what it
skipped; a broken directory is moved aside, never overwritten in place."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from labkit.train.checkpoint_files import (
    MANIFEST,
    MARKER,
    complete_steps,
    move_aside,
    newest_good,
    seal,
    step_dir,
    verify,
)

pytestmark = pytest.mark.lesson07

_FILES = {".metadata": 300, "__0_0.distcp": 2000, "__1_0.distcp": 1800, "meta.json": 40,
          "rank_0.json": 60, "rank_1.json": 60}


def _checkpoint(root: Path, step: int, seed: int = 0) -> Path:
    """A sealed directory shaped like a 2-rank DCP save (random bytes in each file)."""
    rng = random.Random(seed * 1000 + step)
    d = step_dir(root, step)
    d.mkdir(parents=True)
    for name, size in _FILES.items():
        (d / name).write_bytes(bytes(rng.getrandbits(8) for _ in range(size)))
    seal(d)
    return d


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_sealed_checkpoint_verifies_and_lists_every_file(tmp_path: Path) -> None:
    d = _checkpoint(tmp_path, 4)
    assert verify(d) is None
    manifest = json.loads((d / MANIFEST).read_text())
    assert sorted(manifest["files"]) == sorted(_FILES)
    assert json.loads((d / MARKER).read_text())["manifest_sha256"]


def test_a_flipped_byte_anywhere_is_caught_and_named(tmp_path: Path) -> None:
    """Every file, first byte, last byte and 20 random places each: the defect names the
    file and the sha256 check; nothing that changed ever verifies."""
    d = _checkpoint(tmp_path, 2)
    rng = random.Random(14)
    for name, size in _FILES.items():
        for offset in [0, size - 1] + [rng.randrange(size) for _ in range(20)]:
            _flip(d / name, offset)
            defect = verify(d)
            assert defect is not None, f"flipped byte {offset} of {name} was not caught"
            assert (defect.file, defect.check) == (name, "sha256"), defect
            _flip(d / name, offset)  # put it back
    assert verify(d) is None


@pytest.mark.parametrize("damage, file, check", [
    (lambda d: (d / "__1_0.distcp").write_bytes((d / "__1_0.distcp").read_bytes()[:100]),
     "__1_0.distcp", "size"),
    (lambda d: (d / ".metadata").unlink(), ".metadata", "missing"),
    (lambda d: (d / MARKER).unlink(), MARKER, "marker"),
    (lambda d: (d / MARKER).write_text(""), MARKER, "marker"),
    (lambda d: (d / MANIFEST).unlink(), MANIFEST, "missing"),
    (lambda d: _flip(d / MANIFEST, 5), MANIFEST, "sha256"),
    (lambda d: (d / "rank_0.json").write_text("{}"), "rank_0.json", "size"),
])
def test_each_kind_of_damage_names_the_file_and_the_check(tmp_path: Path, damage, file: str,
                                                          check: str) -> None:
    d = _checkpoint(tmp_path, 6)
    damage(d)
    defect = verify(d)
    assert defect is not None and (defect.file, defect.check) == (file, check), defect
    assert file in defect.describe() and f"the {check} check" in defect.describe()


def test_resume_takes_the_newest_good_checkpoint_and_names_the_skipped(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        _checkpoint(tmp_path, step)
    _flip(step_dir(tmp_path, 8) / "__0_0.distcp", 10)
    (step_dir(tmp_path, 6) / MARKER).unlink()  # the case: a deleted marker
    step, skipped = newest_good(tmp_path)
    assert step == 4
    assert [(Path(d.directory).name, d.file, d.check) for d in skipped] == [
        ("step_00000008", "__0_0.distcp", "sha256"), ("step_00000006", MARKER, "marker")]
    assert skipped[0].to_json()["checkpoint"] == "step_00000008"


def test_only_broken_checkpoints_leave_nothing_to_resume_and_say_why(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 2)
    _flip(step_dir(tmp_path, 2) / ".metadata", 0)
    step, skipped = newest_good(tmp_path)
    assert step is None and [d.file for d in skipped] == [".metadata"]
    assert newest_good(tmp_path / "empty") == (None, [])


def test_a_broken_directory_is_moved_aside_under_a_clear_name(tmp_path: Path) -> None:
    d = _checkpoint(tmp_path, 3)
    first = move_aside(d)
    assert first.name == "step_00000003.corrupt" and not d.exists()
    _checkpoint(tmp_path, 3)
    assert move_aside(step_dir(tmp_path, 3)).name == "step_00000003.corrupt2"
    assert complete_steps(tmp_path) == []  # moved-aside directories are never candidates


def test_a_load_failure_names_the_first_rank_s_real_cause_first():
    """DCP says ``CheckpointException ranks:dict_keys([0, 1])``; the lab says the size mismatch."""
    from labkit.train.checkpoint import _first_cause

    class Wrapped(Exception):
        failures = {1: (RuntimeError("b"), None),
                    0: (RuntimeError("Size mismatch: [128, 32] vs [64, 32]\nmore"), None)}
    assert _first_cause(Wrapped("ranks:dict_keys([0, 1])")) == \
        "rank 0: RuntimeError: Size mismatch: [128, 32] vs [64, 32]"
    assert _first_cause(ValueError("plain")) == "ValueError: plain"


def test_identity_refuses_what_changes_the_weights_and_adapts_the_world_size():
    from labkit.train.checkpoint import identity_problems

    mine = {"strategy": "ddp", "model": {"width": 64}, "seed": 0, "batch_size": 32,
            "optimizer": "sgd", "world_size": 2, "grid": {"dp": 2, "pp": 1, "tp": 1}}
    saved = {**mine, "model": {"width": 128}, "world_size": 4, "grid": {"dp": 4, "pp": 1, "tp": 1}}
    refuse, adapt = identity_problems(saved, mine)
    assert refuse == ["model {'width': 128} there, {'width': 64} here"]
    assert adapt[0] == "world_size 4 -> 2 (resharded)" and len(adapt) == 2
    assert identity_problems(None, mine)[0] == []
