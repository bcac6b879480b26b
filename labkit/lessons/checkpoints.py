"""Lesson 07's resharding check: a checkpoint saved by N ranks loads on M.

Two real launches of ``labkit.train.checkpoint``'s rank functions: ``save_sharded`` on
``save_world`` ranks, then ``load_sharded`` on ``load_world`` ranks, and the loaded tensors
compared with the model that was saved (torch's distributed checkpoint reshards on load).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.api import launch
from labkit.config.run import ModelConfig
from labkit.train.checkpoint import load_sharded, save_sharded
from labkit.train.models import build_mlp


def reshard_check(root: str | Path, save_world: int = 4, load_world: int = 2, seed: int = 0,
                  timeout_s: float = 120.0) -> dict[str, Any]:
    """Save a sharded model at ``save_world`` ranks, load it at ``load_world``, compare.

    Two real launches. Returns each side's per-rank shard shapes and the max abs difference
    between the loaded tensors and the model that was saved (0.0 when resharding is exact).
    """
    saved = launch(save_sharded, save_world, str(root), 1, seed, timeout_s=timeout_s,
                   threads_per_rank=1, trace=False)
    loaded = launch(load_sharded, load_world, str(root), 1, timeout_s=timeout_s,
                    threads_per_rank=1, trace=False)
    expected = build_mlp(ModelConfig(), seed).state_dict()
    got = loaded.results[0]["full"]
    diffs = {k: float(abs(got[k] - expected[k].numpy()).max()) for k in expected}
    return {"saved_shapes": saved.results, "loaded_shapes": [r["shapes"] for r in loaded.results],
            "max_abs_diff": max(diffs.values()), "per_tensor": diffs}
