"""Checkpoints on real gloo ranks: bit-identical resume, crash-safe saves, resharding."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import labkit
from labkit.base.errors import RunFailed
from labkit.lessons.checkpoints import reshard_check
from labkit.rank.context import RankContext
from labkit.train.checkpoint import complete_steps, load, save, step_dir

pytestmark = [pytest.mark.distributed, pytest.mark.lesson07]


def _final_state(ckpt: Path, step: int) -> dict[str, Any]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = ckpt.parent / f"{ckpt.name}_{step}.pt"
    dcp_to_torch_save(str(step_dir(ckpt, step)), str(out))
    return torch.load(out, weights_only=False)


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}/"))
        return out
    return {prefix: d}


@pytest.mark.parametrize("strategy,optimizer", [("ddp", "sgd"), ("scaling", "adam")])
def test_resume_after_a_kill_is_bit_identical(tmp_path: Path, strategy: str,
                                              optimizer: str) -> None:
    """Kill rank 1 mid-run, resume: final weights AND optimizer state equal, bit for bit."""
    common = {"strategy": strategy, "world_size": 2, "steps": 8, "optimizer": optimizer, "lr": 0.01,
                  "progress": False, "timeout_s": 90, "threads_per_rank": 1}
    ref = labkit.run(**common, options={"checkpoint_dir": str(tmp_path / "ref"),
                                        "checkpoint_every": 8})
    opts = {"checkpoint_dir": str(tmp_path / "ck"), "checkpoint_every": 3}
    with pytest.raises(RunFailed) as err:
        labkit.run(**common, options=opts, inject_fault="1:5:kill")
    assert err.value.rank == 1
    assert complete_steps(tmp_path / "ck") == [3]
    resumed = labkit.run(**common, options={**opts, "checkpoint_every": 8, "resume": True})
    assert resumed.metrics["resumed_from_step"] == 3
    assert resumed.params_sha256 == ref.params_sha256
    assert resumed.losses == ref.losses
    a, b = _flat(_final_state(tmp_path / "ref", 8)), _flat(_final_state(tmp_path / "ck", 8))
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f"rank 0 checkpoint tensor {k} differs after resume"
        else:
            assert a[k] == b[k], k


def _save_then_die(ctx: RankContext, root: str) -> str:
    state = {"w": torch.full((64,), float(ctx.rank + 1))}
    save(ctx, root, 1, state)
    state["w"].add_(10)

    def die() -> None:
        if ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    save(ctx, root, 2, state, before_commit=die)
    return "unreachable"


def _load_latest(ctx: RankContext, root: str) -> list[float]:
    state = {"w": torch.zeros(64)}
    meta, _ = load(ctx, root, complete_steps(root)[-1], state)
    return [meta["step"], float(state["w"].min()), float(state["w"].max())]


def test_a_kill_during_save_leaves_only_the_previous_checkpoint(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    with pytest.raises(RunFailed):
        labkit.launch(_save_then_die, 2, root, timeout_s=60, trace=False)
    assert complete_steps(root) == [1]
    assert (tmp_path / "ck" / "step_00000002.partial").is_dir()
    loaded = labkit.launch(_load_latest, 2, root, timeout_s=60, trace=False)
    for rank, (step, lo, hi) in enumerate(loaded.results):
        assert step == 1 and lo == hi, f"rank {rank} loaded step {step}, w in [{lo}, {hi}]"


def test_save_at_4_ranks_load_at_2(tmp_path: Path) -> None:
    res = reshard_check(tmp_path / "ck", save_world=4, load_world=2)
    assert res["max_abs_diff"] == 0.0, res["per_tensor"]
    assert res["saved_shapes"][0]["0.weight"] == (32, 32)
    assert res["loaded_shapes"][0]["0.weight"] == (64, 32)


# ---- integrity (issue 14): a damaged checkpoint is never loaded --------------------------

_RUN = {"strategy": "ddp", "world_size": 2, "steps": 6, "lr": 0.01, "progress": False,
        "timeout_s": 90, "threads_per_rank": 1}


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str | None]:
    """One uninterrupted run with checkpoints at steps 2, 4 and 6; its final weights' hash."""
    root = tmp_path_factory.mktemp("integrity") / "ck"
    res = labkit.run(**_RUN, options={"checkpoint_dir": str(root), "checkpoint_every": 2})
    assert complete_steps(root) == [2, 4, 6]
    return root, res.params_sha256


def _copy(saved: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(saved, tmp_path / "ck"))


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def _resume(root: Path) -> labkit.RunResult:
    return labkit.run(**_RUN, options={"checkpoint_dir": str(root), "checkpoint_every": 2,
                                       "resume": True})


def test_a_flipped_shard_byte_falls_back_and_the_run_finishes_identically(
        saved_run: tuple[Path, str | None], tmp_path: Path) -> None:
    """Step 6's shard of rank 1 has one flipped byte: the resume says it skipped it (file and
    check), starts from step 4, saves step 6 again after moving the bad one aside, and ends
    with the same weights as the run that was never damaged."""
    saved, ref_sha = saved_run
    root = _copy(saved, tmp_path)
    _flip(step_dir(root, 6) / "__1_0.distcp", 1000)
    res = _resume(root)
    assert res.metrics["resumed_from_step"] == 4
    assert res.metrics["checkpoint_fallback"] == [{
        "checkpoint": "step_00000006", "file": "__1_0.distcp", "check": "sha256",
        "detail": "its bytes changed since the save", "resumed_from_step": 4}]
    assert res.metrics["checkpoints_moved_aside"] == ["step_00000006.corrupt"]
    assert len(res.losses) == 6 and res.params_sha256 == ref_sha
    assert "skipping checkpoint step_00000006" in res.logs[0]
    assert complete_steps(root) == [2, 4, 6] and (root / "step_00000006.corrupt").is_dir()


def test_damaged_metadata_and_a_truncated_shard_fall_back_two_steps(
        saved_run: tuple[Path, str | None], tmp_path: Path) -> None:
    """The issue's cases: step 6 lost DCP's .metadata (the saver used to call that directory
    committed and crash with FileExistsError), step 4 has a truncated shard."""
    saved, ref_sha = saved_run
    root = _copy(saved, tmp_path)
    (step_dir(root, 6) / ".metadata").unlink()
    shard = step_dir(root, 4) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-7])
    res = _resume(root)
    assert res.metrics["resumed_from_step"] == 2
    assert [(f["checkpoint"], f["file"], f["check"]) for f in res.metrics["checkpoint_fallback"]
            ] == [("step_00000006", ".metadata", "missing"), ("step_00000004", "__0_0.distcp",
                                                            "size")]
    assert sorted(res.metrics["checkpoints_moved_aside"]) == ["step_00000004.corrupt",
                                                              "step_00000006.corrupt"]
    assert len(res.losses) == 6 and res.params_sha256 == ref_sha


def test_only_damaged_checkpoints_refuse_naming_the_file_and_the_check(
        saved_run: tuple[Path, str | None], tmp_path: Path) -> None:
    saved, _ = saved_run
    root = _copy(saved, tmp_path)
    for step in (2, 4, 6):
        _flip(step_dir(root, step) / ".metadata", 100)
    with pytest.raises(RunFailed) as err:
        _resume(root)
    msg = err.value.failure.message
    assert "CheckpointError: no checkpoint under" in msg
    assert "step_00000002/.metadata failed the sha256 check" in msg, msg


def _load_step(ctx: RankContext, root: str, step: int) -> float:
    state = {"model": {k: torch.zeros_like(v) for k, v in _mlp_state().items()}}
    load(ctx, root, step, state)
    return float(sum(v.abs().sum() for v in state["model"].values()))


def _mlp_state() -> dict[str, torch.Tensor]:
    from labkit.train.models import build_mlp

    return dict(build_mlp(labkit.ModelConfig(), 0).state_dict())


def test_load_refuses_a_damaged_checkpoint_before_reading_it(tmp_path: Path) -> None:
    """The library's own load(): a flipped byte in a shard is never loaded, on any rank."""
    root = str(tmp_path / "ck")
    labkit.launch(_save_model, 2, root, timeout_s=60, trace=False)
    _flip(step_dir(root, 1) / "__0_0.distcp", 3000)
    with pytest.raises(RunFailed) as err:
        labkit.launch(_load_step, 2, root, 1, timeout_s=60, trace=False)
    assert "CheckpointError" in err.value.failure.message
    assert "__0_0.distcp failed the sha256 check" in err.value.failure.message


def _save_model(ctx: RankContext, root: str) -> None:
    save(ctx, root, 1, {"model": _mlp_state()})


def _ckpt_run(tmp_path: Path, **kw: Any) -> Any:
    common: dict[str, Any] = {"strategy": "ddp", "world_size": 2, "steps": 4, "lr": 0.01,
                              "progress": False, "timeout_s": 90, "threads_per_rank": 1}
    opts = {"checkpoint_dir": str(tmp_path / "ck"), "checkpoint_every": 2,
            **kw.pop("options", {})}
    return labkit.run(**{**common, **kw}, options=opts)


def test_a_checkpoint_knows_its_run_and_refuses_another_before_loading(tmp_path: Path) -> None:
    """Issue 36: a seed-0 ddp checkpoint is refused by a seed-1 resume and by another strategy,
    each difference named with both values; a resume at the same settings goes on."""
    import json

    _ckpt_run(tmp_path)
    meta = json.loads((step_dir(tmp_path / "ck", 4) / "meta.json").read_text())
    assert meta["step"] == 4 and meta["run"]["seed"] == 0 and meta["run"]["strategy"] == "ddp"
    assert meta["run"]["world_size"] == 2 and meta["run"]["labkit"] == labkit.__version__
    with pytest.raises(RunFailed, match=r"belongs to another run: seed 0 there, 1 here"):
        _ckpt_run(tmp_path, seed=1, steps=6, options={"resume": True})
    with pytest.raises(RunFailed, match=r"strategy 'ddp' there, 'scaling' here"):
        _ckpt_run(tmp_path, strategy="scaling", steps=6, options={"resume": True})
    ok = _ckpt_run(tmp_path, steps=6, options={"resume": True})
    assert ok.metrics["resumed_from_step"] == 4 and ok.metrics["resume_adapted"] == []


def test_a_renamed_step_directory_is_not_taken_for_a_later_step(tmp_path: Path) -> None:
    """A copy of step 2 renamed step 8 is skipped (its meta.json says 2): the resume falls back
    to step 4 and says which check the renamed one failed."""
    import shutil

    _ckpt_run(tmp_path)
    shutil.copytree(step_dir(tmp_path / "ck", 2), step_dir(tmp_path / "ck", 8))
    r = _ckpt_run(tmp_path, steps=6, options={"resume": True})
    assert r.metrics["resumed_from_step"] == 4
    (skipped,) = r.metrics["checkpoint_fallback"]
    assert skipped["checkpoint"] == "step_00000008" and skipped["check"] == "step", skipped
    assert "saved after step 2" in skipped["detail"]


def test_resume_without_a_checkpoint_dir_says_it_starts_at_step_0(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="nothing to resume, so the run starts at step 0"):
        r = _ckpt_run(tmp_path, options={"resume": True, "checkpoint_dir": str(tmp_path / "no")})
    assert r.metrics.get("resumed_from_step") is None and r.metrics["checkpoints_saved"] == [2, 4]
