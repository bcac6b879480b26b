"""Sharded, crash-safe checkpoints with ``torch.distributed.checkpoint`` (DCP).

Teaches: a checkpoint is only useful if a crash can never leave one that *looks* complete,
and if a damaged one is never loaded. Every save goes to a fresh directory
``step_NNNNNNNN.partial``; every rank writes its own shard there (DCP splits the state
across ranks and writes a ``.metadata`` index), then rank 0 writes ``meta.json``, a
manifest with the size and SHA-256 of every file, and a ``COMPLETE`` marker holding the
manifest's hash, and commits with one atomic ``os.rename`` to ``step_NNNNNNNN``. A run
killed at any instant of a save leaves at worst a ``.partial`` directory, which the loader
never reads and the next save of that step deletes. A committed directory is never written
again; a resume checks every byte against the manifest and falls back to the newest
checkpoint that passes (``labkit.train.checkpoint_files``).

Because DCP records which slice of each tensor every shard holds, a checkpoint written by
4 ranks loads on 2 (resharding) — see the PyTorch DCP docs,
https://pytorch.org/docs/stable/distributed.checkpoint.html.

The step number is the count of *completed* optimizer steps, so resuming from
``step_00000010`` starts at step 10 and, with the data order a pure function of the step
(``labkit.train.training.SyntheticTask``), replays exactly the batches the lost run would have seen.

Torch is imported lazily: the torch-free ``complete_steps`` is used by config checks.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labkit.base.errors import CheckpointError
from labkit.base.events import Op
from labkit.base.files import fsync_dir, write_json_atomic
from labkit.train.checkpoint_files import (
    MARKER,
    checkpoint_problems,
    choose_resume_step,
    complete_steps,
    latest_step,
    move_aside,
    seal,
    step_dir,
    verify,
)

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from labkit.rank.context import RankContext

__all__ = ["MARKER", "Checkpointer", "CheckpointOptions", "checkpoint_problems",
           "complete_steps", "latest_step", "load", "save", "step_dir"]
_log = logging.getLogger("labkit.train.checkpoint")


def save(ctx: RankContext, root: str | Path, step: int, state: dict[str, Any], *,
         meta: dict[str, Any] | None = None, rank_meta: dict[str, Any] | None = None,
         before_commit: Callable[[], None] | None = None,
         moved_aside: list[str] | None = None) -> Path:
    """Collectively save ``state`` as checkpoint ``step`` under ``root``; returns its directory.

    Every rank must call it. ``meta`` (rank 0's) goes to ``meta.json``; ``rank_meta`` to
    ``rank_R.json`` (e.g. that rank's loss history). ``before_commit`` is a test hook run on
    every rank after the shards are written and before the commit. A directory of this step
    that is not a committed checkpoint (it fails ``verify``) is moved aside to
    ``step_NNNNNNNN.corrupt``, logged and appended to ``moved_aside``.
    """
    import torch.distributed.checkpoint as dcp

    final = step_dir(root, step)
    partial = final.with_name(final.name + ".partial")
    with ctx.tracer.span(Op.CHECKPOINT, step=step, name=f"save {final.name}"):
        # 1. rank 0 refuses to overwrite a committed checkpoint, moves a broken one aside,
        #    clears a dead save's leftovers
        if ctx.rank == 0:
            if final.exists():
                defect = verify(final)
                if defect is None:
                    raise FileExistsError(f"checkpoint {final} already exists; committed "
                                          f"checkpoints are never overwritten")
                aside = move_aside(final)
                _log.warning("checkpoint %s is not committed (%s); moved it to %s before "
                             "saving step %d again", final.name, defect.describe(), aside.name,
                             step)
                if moved_aside is not None:
                    moved_aside.append(aside.name)
            Path(root).mkdir(parents=True, exist_ok=True)
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
        ctx.comm.barrier(step=step)
        # 2. every rank writes its shard; DCP's coordinator writes .metadata last
        dcp.save(state, checkpoint_id=str(partial))
        if rank_meta is not None:
            write_json_atomic(partial / f"rank_{ctx.rank}.json", rank_meta)
        if before_commit is not None:
            before_commit()
        ctx.comm.barrier(step=step)
        # 3. rank 0 commits: metadata, the manifest of checksums, the marker, one rename
        if ctx.rank == 0:
            write_json_atomic(partial / "meta.json", {"step": step, "world_size": ctx.world_size,
                                                "saved_at": time.time(), **(meta or {})})
            seal(partial)
            fsync_dir(partial)
            os.rename(partial, final)
            fsync_dir(Path(root))
        # 4. nobody moves on before the checkpoint is visible
        ctx.comm.barrier(step=step)
    return final


def load(ctx: RankContext, root: str | Path, step: int, state: dict[str, Any], *,
         verified: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Load checkpoint ``step`` *in place* into ``state`` (reshards when world sizes differ).

    Rank 0 first checks every file against the manifest (skipped when ``verified``: the
    caller did) and tells every rank; a failed check raises ``CheckpointError`` naming the
    file and the check on every rank, before a byte is loaded. Returns ``(meta,
    rank_meta)``; ``rank_meta`` is this rank's own record when the checkpoint was written
    at the same world size, else None.
    """
    import torch.distributed.checkpoint as dcp

    path = step_dir(root, step)
    if not verified:
        defect = ctx.comm.broadcast_object(verify(path) if ctx.rank == 0 else None, step=step)
        if defect is not None:
            raise CheckpointError(f"checkpoint {path} cannot be loaded: {defect.describe()}")
    with ctx.tracer.span(Op.CHECKPOINT, step=step, name=f"load {path.name}"):
        try:
            dcp.load(state, checkpoint_id=str(path))
        except Exception as err:  # DCP wraps each rank's cause: say the first one first
            raise CheckpointError(f"checkpoint {path} does not fit this run's model and "
                                  f"optimizer: {_first_cause(err)}") from err
    meta = json.loads((path / "meta.json").read_text())
    mine = path / f"rank_{ctx.rank}.json"
    rank_meta = (json.loads(mine.read_text())
                 if meta.get("world_size") == ctx.world_size and mine.is_file() else None)
    return meta, rank_meta


def _first_cause(err: BaseException) -> str:
    """The real reason behind DCP's ``CheckpointException ranks:dict_keys([0, 1])``."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, wrapped = sorted(failures.items())[0]
        cause = wrapped[0] if isinstance(wrapped, tuple) else wrapped
        return f"rank {rank}: {type(cause).__name__}: {str(cause).strip().splitlines()[0]}"
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"


RUN_FIELDS = ("strategy", "model", "seed", "batch_size", "optimizer")
"""What a checkpoint must share with the run that resumes it: another value means other
weights, another data order or another optimizer state (world size and grid are adapted:
DCP reshards)."""


def run_identity(config: Any, world_size: int, grid: dict[str, int] | None = None) -> dict[str, Any]:
    """What a checkpoint belongs to: the run's ``RUN_FIELDS``, world size, grid, labkit."""
    from labkit import __version__

    ident = {k: config.to_json()[k] for k in RUN_FIELDS}
    ident = {**ident, "world_size": world_size, "grid": grid or {}, "labkit": __version__}
    return dict(json.loads(json.dumps(ident)))  # as meta.json will read back (lists, not tuples)


def identity_problems(saved: dict[str, Any] | None, mine: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what refuses the resume, what it adapts): a field of ``RUN_FIELDS`` that differs
    refuses, named with both values; another world size or grid is resharded."""
    if saved is None:
        return [], ["the checkpoint records no run (written by an older labkit): not checked"]
    refuse = [f"{k} {saved.get(k)!r} there, {mine[k]!r} here" for k in RUN_FIELDS
              if saved.get(k) != mine[k]]
    adapt = [f"{k} {saved.get(k)} -> {mine[k]} (resharded)" for k in ("world_size", "grid")
             if saved.get(k) is not None and saved.get(k) != mine[k]]
    return refuse, adapt


def training_state(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter name (DCP's ``get_state_dict``)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def restore_training_state(model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


class Checkpointer:
    """The checkpoint policy of a training loop: resume at the start, save every K steps.

    ``start()`` returns the first step to run and the loss history restored with it;
    ``after_step(step, losses)`` saves when ``step + 1`` is a multiple of ``every``.
    """

    def __init__(self, ctx: RankContext, root: str | None, every: int, resume: bool,
                 model: nn.Module, optimizer: Optimizer, identity: dict[str, Any] | None = None):
        self.ctx, self.root, self.every, self.resume = ctx, root, every, resume
        self.model, self.optimizer = model, optimizer
        self.identity = identity
        """What this run is (``run_identity``): saved with every checkpoint, checked on resume."""
        self.adapted: list[str] = []
        self.saved: list[int] = []
        self.resumed_from: int | None = None
        self.fallback: list[dict[str, Any]] | None = None
        """Newer checkpoints a resume skipped: which, the file, the check it failed."""
        self.moved_aside: list[str] = []

    def start(self) -> tuple[int, list[float]]:
        if not (self.root and self.resume):
            return 0, []
        step, skipped = choose_resume_step(self.ctx, self.root)
        self.fallback = [d.to_json() for d in skipped]
        if step is None:
            return 0, []
        self._check_identity(step)
        state = training_state(self.model, self.optimizer)
        _, rank_meta = load(self.ctx, self.root, step, state, verified=True)
        restore_training_state(self.model, self.optimizer, state)
        self.resumed_from = step
        for entry in self.fallback:
            entry["resumed_from_step"] = step
        return step, list((rank_meta or {}).get("losses", []))

    def _check_identity(self, step: int) -> None:
        """Refuse a checkpoint of another run before a byte of it is loaded."""
        if self.identity is None or self.root is None:
            return
        meta = json.loads((step_dir(self.root, step) / "meta.json").read_text())
        refuse, self.adapted = identity_problems(meta.get("run"), self.identity)
        if refuse:
            raise CheckpointError(
                f"checkpoint {step_dir(self.root, step)} belongs to another run: "
                + "; ".join(refuse) + ". Resume with the settings it was saved with, or start "
                "from an empty checkpoint_dir")

    @property
    def saves(self) -> bool:
        """Whether ``after_step`` ever saves (a directory and an interval are set)."""
        return bool(self.root) and self.every >= 1

    def after_step(self, step: int, losses: list[float]) -> bool:
        """Save when ``step + 1`` is a multiple of ``every``; True when it saved."""
        done = step + 1
        if not self.saves or done % self.every:
            return False
        assert self.root is not None
        save(self.ctx, self.root, done, training_state(self.model, self.optimizer),
             meta=None if self.identity is None else {"run": self.identity},
             rank_meta={"losses": losses}, moved_aside=self.moved_aside)
        self.saved.append(done)
        return True

    def metrics(self) -> dict[str, Any]:
        return {"checkpoints_saved": list(self.saved), "resumed_from_step": self.resumed_from,
                "checkpoint_fallback": self.fallback, "resume_adapted": list(self.adapted),
                "checkpoints_moved_aside": list(self.moved_aside)}


@dataclass(kw_only=True, frozen=True)
class CheckpointOptions:
    """The checkpoint settings every checkpointing strategy takes (inherit from this)."""

    checkpoint_dir: str | None = None
    """Directory of sharded checkpoints (torch.distributed.checkpoint); None: no checkpoints."""
    checkpoint_every: int = 0
    """Save a checkpoint every K completed steps (0: never)."""
    resume: bool = False
    """Continue from the last complete checkpoint in checkpoint_dir (weights, optimizer, data)."""

    def checkpoint_problems(self) -> list[str]:
        return checkpoint_problems(self.checkpoint_dir, self.checkpoint_every, self.resume)


# --- resharding: save at N ranks, load at M ------------------------------------------------

def _sharded_model_state(ctx: RankContext, seed: int, empty: bool) -> dict[str, Any]:
    """The lesson MLP's weights as DTensors split by rows (Shard(0)) over all ranks."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from labkit.config.run import ModelConfig
    from labkit.train.models import build_mlp

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    full = build_mlp(ModelConfig(), seed).state_dict()
    return {"model": {k: distribute_tensor(torch.zeros_like(v) if empty else v, mesh, [Shard(0)])
                      for k, v in full.items()}}


def save_sharded(ctx: RankContext, root: str, step: int, seed: int = 0) -> dict[str, Any]:
    """Rank code: save the row-sharded model; returns this rank's shard shapes."""
    state = _sharded_model_state(ctx, seed, empty=False)
    save(ctx, root, step, state)
    return {k: tuple(v.to_local().shape) for k, v in state["model"].items()}


def load_sharded(ctx: RankContext, root: str, step: int) -> dict[str, Any]:
    """Rank code: load into row shards at this world size; rank 0 returns the full tensors."""
    state = _sharded_model_state(ctx, 0, empty=True)
    load(ctx, root, step, state)
    # numpy: plain bytes on the way back to the supervisor
    full = {k: v.full_tensor().numpy().copy() for k, v in state["model"].items()}
    shapes = {k: tuple(v.to_local().shape) for k, v in state["model"].items()}
    return {"shapes": shapes, "full": full if ctx.rank == 0 else None}
