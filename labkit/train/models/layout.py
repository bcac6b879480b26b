"""How a model runs, in the pieces a pipeline cuts between.

Every model the registry builds runs as ``epilogue(blocks[n-1](... blocks[0](prologue(x))))``:
the prologue (the GPT's embedding; nothing for an MLP) and the epilogue (the GPT's final
LayerNorm and head; the MLP's classifier) ride with the first and last pipeline stage, and
the blocks between them are what stages split. ``act_shape(rows)`` is the activation that
crosses a cut for ``rows`` samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn


@dataclass
class Layout:
    """A model as prologue, blocks and epilogue (the same modules, not copies)."""

    blocks: list[nn.Module]
    act_shape: Callable[[int], tuple[int, ...]]
    """The activation between two blocks for ``rows`` samples."""
    prologue: Callable[[Any], Any] | None = None
    """Runs on the model's input before the first block (the first stage only)."""
    epilogue: Callable[[Any], Any] | None = None
    """Runs after the last block (the last stage only)."""
    prologue_modules: list[nn.Module] = field(default_factory=list)
    """The modules holding the prologue's parameters."""
    epilogue_modules: list[nn.Module] = field(default_factory=list)
    """The modules holding the epilogue's parameters."""

    def run(self, x: Any, lo: int = 0, hi: int | None = None, *, first: bool = True,
            last: bool = True) -> Any:
        """Blocks ``lo..hi-1``, with the prologue when ``first`` and the epilogue when
        ``last`` (the whole model by default)."""
        if first and self.prologue is not None:
            x = self.prologue(x)
        for block in self.blocks[lo:hi]:
            x = block(x)
        if last and self.epilogue is not None:
            x = self.epilogue(x)
        return x
