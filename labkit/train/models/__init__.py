"""The one model registry: what ``RunConfig.model`` means, for every strategy.

``build_model(config)`` builds the model of ``config.model.kind`` -- the MLP (``mlp``),
the digits classifier (the MLP on 8x8 images) or the GPT (``gpt``) -- identical on every
rank for the same seed and always initialised on the CPU; ``task_for(config)`` the data it
trains on; ``layout_of(model)`` the pieces a pipeline cuts between (``Layout``).

The parallelisms are transforms applied to what this builds (``labkit.train.parallel``):
tensor parallelism slices the transformer's attention heads and MLP columns in place,
pipeline parallelism keeps a stage's run of blocks, ZeRO turns parameter-owning modules
into sharded units, DDP wraps the whole. Nothing here knows about them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from torch import nn

from labkit.train.data import DigitsTask, SyntheticTask, Task, TextTask
from labkit.train.models.gpt import GPT, Blocks, blocks_layout, build_blocks, build_gpt, gpt_layout
from labkit.train.models.layout import Layout
from labkit.train.models.mlp import build_mlp, mlp_layout

__all__ = ["GPT", "Blocks", "Layout", "build_blocks", "build_gpt", "build_mlp", "build_model",
           "layout_of", "task_for"]


def build_model(config: Any, block_costs: Sequence[int] = ()) -> nn.Module:
    """The model a run trains (``config.model.kind``), identical on every rank for the same
    seed and initialised on the CPU. ``block_costs``: the MLP's blocks of several
    Linear+ReLU pairs (pipeline lessons)."""
    m = config.model
    if m.kind == "gpt":
        from labkit.train.data.text import vocab_size_of

        return build_gpt(vocab_size_of(m.vocab_size), m.width, m.depth, m.heads, m.seq_len,
                         config.seed)
    if m.kind == "digits":
        m = dataclasses.replace(m, in_dim=DigitsTask.in_dim, out_dim=DigitsTask.classes)
    return build_mlp(m, config.seed, block_costs)


def layout_of(model: nn.Module) -> Layout:
    """``model`` (one ``build_model`` or ``build_blocks`` made) as prologue, blocks and
    epilogue."""
    if isinstance(model, GPT):
        return gpt_layout(model)
    if isinstance(model, Blocks):
        return blocks_layout(model)
    if isinstance(model, nn.Sequential):
        return mlp_layout(model)
    raise TypeError(f"no layout for {type(model).__name__}: build it with build_model")


def task_for(config: Any) -> Task:
    """The data of ``config.model.kind`` (``labkit.train.data``), the same on every rank."""
    m = config.model
    if m.kind == "gpt":
        return TextTask(config.seed, m.seq_len, m.vocab_size)
    if m.kind == "digits":
        return DigitsTask(config.seed)
    return SyntheticTask(config.seed, m.in_dim, m.out_dim)
