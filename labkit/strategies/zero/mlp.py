"""The lesson MLP (Linear+ReLU blocks, then a Linear) sharded by ZeRO, with checkpointing.

Every Linear becomes a ``FlatLayer`` (``labkit.strategies.zero.sharding``) driven by
``ShardedLinear``; ``__call__`` runs the blocks, optionally in checkpointed segments of
``segment`` hidden blocks (reentrant ``torch.utils.checkpoint``, which saves only each
segment's input, where the byte accounting can see it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from labkit.strategies.zero.sharding import FlatLayer, Meter, ShardedLinear, ShardedUnits
from labkit.trace.comm import Comm


class ShardedMLP(ShardedUnits):
    """The lesson MLP (Linear+ReLU blocks, then a Linear) over ``FlatLayer`` buffers."""

    def __init__(self, reference: torch.nn.Sequential, *, stage: int, dtype: torch.dtype,
                 pad: bool, comm: Comm, checkpointing: bool = False, segment: int = 2):
        self.meter = Meter()
        linears = [m for m in reference if isinstance(m, torch.nn.Linear)]
        self.layers = [FlatLayer(i, m.weight, m.bias, stage=stage, dtype=dtype, pad=pad,
                                 comm=comm, meter=self.meter) for i, m in enumerate(linears)]
        self.units = list(self.layers)
        self.checkpointing, self.segment = checkpointing, segment
        self.step = 0

    def _segment(self, first: int, stop: int) -> Callable[..., torch.Tensor]:
        """Hidden blocks ``first..stop-1`` (Linear+ReLU each) as one function."""
        def run(x: torch.Tensor, *anchors: torch.Tensor) -> torch.Tensor:
            for i, anchor in zip(range(first, stop), anchors):
                x = torch.relu(ShardedLinear.apply(x, anchor, self.layers[i], self.step))
            return x
        return run

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        hidden = len(self.layers) - 1
        k = self.segment if self.checkpointing else hidden
        for first in range(0, hidden, max(k, 1)):
            stop = min(first + k, hidden)
            run = self._segment(first, stop)
            anchors = [layer.anchor for layer in self.layers[first:stop]]
            if self.checkpointing:
                # reentrant checkpoint saves only the segment input (visible to our hooks)
                x = checkpoint(run, x, *anchors, use_reentrant=True)
            else:
                x = run(x, *anchors)
        last = self.layers[-1]
        return ShardedLinear.apply(x, last.anchor, last, self.step)

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every layer's full fp32 weights under ``build_mlp``'s state-dict names.

        Stages 1-3 gather the fp32 masters (a collective: every rank must call this).
        """
        state: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            w, b = layer.weights(layer.gather_full())
            assert b is not None
            state[f"{2 * i}.weight"], state[f"{2 * i}.bias"] = w.clone(), b.clone()
        return state
