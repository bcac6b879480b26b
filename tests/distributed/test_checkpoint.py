"""Checkpoints on real gloo ranks: bit-identical resume, crash-safe saves, resharding."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import labkit
from labkit.checkpoint import complete_steps, load, reshard_check, save, step_dir
from labkit.errors import RunFailed
from labkit.rank import RankContext

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
