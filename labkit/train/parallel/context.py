"""Context parallelism as a transform: the GPT's sequence split over a ``cp`` group.

Megatron-LM's context parallelism and picotron's ``context_parallel``: each of the ``cp``
ranks of a group holds ``s / cp`` tokens of every sequence -- two chunks of ``s / (2 cp)``,
chunks ``i`` and ``2cp-1-i`` (zig-zag), so that causal attention costs every rank the same
(``labkit.theory.context.blocks_per_step``). Everything in a transformer but attention works
token by token, so those tokens go through the embedding, the LayerNorms, the MLPs and the
head on their rank alone; attention is the one place a token needs the others, and ring
attention (``labkit.train.parallel.ring_attention``) passes the key/value blocks around the
group for it. What changes in the model:

1. **embed**: this rank's token ids and their *global* positions (the position embedding of
   the token, wherever it sits);
2. **attention**: ``ring_attention`` over the cp group in place of the local softmax;
3. **loss**: against this rank's targets (``shard_targets``); each rank's loss is the mean
   over its own tokens, so the gradients of the replicated weights are averaged over the cp
   group once per step (``average_over_cp``; Megatron folds that into the data-parallel
   reduction over dp x cp).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.train.parallel.attention_blocks import shard_positions
from labkit.train.parallel.ring_attention import Ring, ring_attention


class RingCore(nn.Module):
    """The attention core ``(q, k, v) -> out`` as ring attention over ``ring``'s group."""

    def __init__(self, ring: Ring):
        super().__init__()
        self.ring = ring

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.ring)


def context_parallel(model: nn.Module, comm: Any, *, zigzag: bool = True) -> list[Ring]:
    """Split ``model`` (a GPT) over the cp group ``comm`` in place: its embedding keeps this
    rank's tokens, every attention becomes ring attention. Returns the rings (set their
    ``step`` to label the spans; their ``stats`` count the blocks computed)."""
    from labkit.train.models.gpt import GPT, Attention

    if not isinstance(model, GPT):
        raise TypeError(f"context parallelism splits the GPT's sequence, not a "
                        f"{type(model).__name__}'s")
    cp, rank = comm.world_size, comm.rank
    model.cp_positions = shard_positions(model.seq_len, rank, cp, zigzag=zigzag)
    model.seq_split *= cp
    rings = []
    for mod in model.modules():
        if isinstance(mod, Attention):
            ring = Ring(comm, model.seq_len, causal=True, zigzag=zigzag)
            mod.core = RingCore(ring)
            rings.append(ring)
    return rings


def shard_targets(y: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """This rank's targets ``(batch, s / cp)``, in its tokens' order."""
    return y.index_select(1, positions.to(y.device))


def average_over_cp(units: list[Any], comm: Any, step: int) -> None:
    """Average every ZeRO unit's step gradient (summed over the microbatches, before the
    data-parallel reduction) over the cp group: one all-reduce per unit, of its parameters
    only (not the padding)."""
    if comm.world_size == 1:
        return
    for unit in units:
        if unit.acc is not None:
            comm.all_reduce(unit.acc[:unit.numel], op="avg", step=step, bucket=unit.index,
                            name=f"CP{unit.index}")
