"""How long each block of the model takes, measured, for balancing the pipeline by cost.

A transformer's stages are uneven even with equal block counts: the first stage also embeds
the tokens and the last one also runs the final LayerNorm and the head, a ``width x vocab``
matmul that is as big as a block once the vocabulary is a few thousand word pieces (GPT-2's
head is 38 M of its 124 M parameters). So the embedding's time is added to the first block's
cost and the head's to the last block's; ``labkit.strategies.pipeline.partition`` then
picks the cuts that minimise the slowest stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def _seconds(run: Callable[[], None], repeats: int = 5) -> float:
    """The fastest of ``repeats`` runs (after one warm-up): on a shared machine the other
    runs only add waiting for a core, never less work."""
    times = []
    for _ in range(repeats + 1):  # the first run warms up the allocator
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times[1:])


def measure_block_costs(full: Any, config: Any, rows: int) -> list[float]:
    """Seconds of forward + backward of each block on a microbatch of ``rows`` samples
    (embedding folded into the first block, final LayerNorm + head into the last)."""
    if config.model.kind != "gpt":
        from labkit.strategies.pipeline.model import measure_layer_costs

        return measure_layer_costs(full, rows)
    seq, width = full.seq_len, full.width
    idx = torch.randint(0, full.tok.num_embeddings, (rows, seq))

    def block_run(block: Any) -> Callable[[], None]:
        def run() -> None:
            x = torch.randn(rows, seq, width, requires_grad=True)
            block(x).sum().backward()
        return run

    costs = [_seconds(block_run(b)) for b in full.blocks]
    costs[0] += _seconds(lambda: full.embed(idx).sum().backward())
    costs[-1] += _seconds(block_run(lambda x: full.head(full.ln_f(x))))
    full.zero_grad(set_to_none=True)
    return costs
