"""The scaling strategy's options, LR rules and checkpoint-directory rules (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.base.errors import ConfigError
from labkit.config.run import RunConfig
from labkit.strategies.scaling import ScalingOptions, global_batch_of
from labkit.train.checkpoint import MARKER, checkpoint_problems, complete_steps, latest_step

pytestmark = pytest.mark.lesson02


def cfg(**options: object) -> RunConfig:
    return RunConfig(strategy="scaling", world_size=4, batch_size=16, lr=0.2, options=options)


def test_bad_options_are_named_with_a_valid_example() -> None:
    with pytest.raises(ConfigError) as err:
        ScalingOptions(lr_rule="cubic", accumulation=0, clip_grad_norm=-1.0, warmup_steps=-2)
    text = str(err.value)
    for piece in ("lr_rule ('cubic') must be one of none, linear, sqrt", "accumulation (0)",
                  "clip_grad_norm (-1.0)", "warmup_steps (-2)", "e.g."):
        assert piece in text, f"missing {piece!r} in {text!r}"


def test_global_batch_too_large_for_the_dataset_is_rejected_before_start() -> None:
    with pytest.raises(ConfigError, match="global batch"):
        RunConfig(strategy="scaling", world_size=4, batch_size=1024, options={"accumulation": 4})


def test_target_lr_follows_the_theory_rules() -> None:
    pytest.importorskip("torch")
    from labkit.strategies.scaling.impl import lr_for_step, target_lr

    assert global_batch_of(cfg()) == 64
    assert target_lr(cfg()) == pytest.approx(0.2)
    assert target_lr(cfg(lr_rule="linear")) == pytest.approx(0.8)
    assert target_lr(cfg(lr_rule="sqrt")) == pytest.approx(0.4)
    assert target_lr(cfg(lr_rule="linear", base_batch=32)) == pytest.approx(0.4)
    warm = cfg(lr_rule="linear", warmup_steps=4)
    assert [lr_for_step(warm, s) for s in range(6)] == pytest.approx([0, .2, .4, .6, .8, .8])


def test_checkpoint_rules(tmp_path: Path) -> None:
    assert checkpoint_problems(None, 0, False) == []
    assert "need checkpoint_dir" in checkpoint_problems(None, 5, False)[0]
    assert "need checkpoint_dir" in checkpoint_problems(None, 0, True)[0]
    assert "checkpoint_every (-1)" in checkpoint_problems(str(tmp_path), -1, False)[0]
    done = tmp_path / "step_00000004"
    done.mkdir()
    (done / ".metadata").touch()
    (done / MARKER).touch()
    assert "already holds checkpoints" in checkpoint_problems(str(tmp_path), 2, False)[0]
    assert checkpoint_problems(str(tmp_path), 2, True) == []


def test_only_committed_directories_count_as_checkpoints(tmp_path: Path) -> None:
    """A .partial directory, or one without the marker or DCP's .metadata, is never loaded."""
    for name, files in [("step_00000002", [".metadata", MARKER]),
                        ("step_00000004.partial", [".metadata", MARKER]),
                        ("step_00000006", [".metadata"]),
                        ("step_00000008", [MARKER]),
                        ("notes", [])]:
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).touch()
    assert complete_steps(tmp_path) == [2]
    assert latest_step(tmp_path) == 2
    assert latest_step(tmp_path / "missing") is None


def test_ddp_gets_the_checkpoint_flags() -> None:
    from labkit.config.flags import option_flags
    from labkit.config.registry import get

    p = option_flags(get("ddp").options)
    ns = p.parse_args(["--checkpoint-dir", "D", "--checkpoint-every", "3", "--resume"])
    assert (ns.checkpoint_dir, ns.checkpoint_every, ns.resume) == ("D", 3, True)
