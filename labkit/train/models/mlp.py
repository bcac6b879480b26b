"""The lab's MLP: ``depth`` Linear+ReLU blocks, then a Linear classifier.

One flat ``nn.Sequential`` (parameter names ``0.weight``, ``2.weight``, ...), identical on
every rank for the same seed. The synthetic task and the digits use it; a pipeline cuts it
between blocks. ``block_costs`` makes some blocks heavier than others (block ``i`` holds
``block_costs[i]`` Linear+ReLU pairs) so a lesson can watch the stage holding them cap a
pipeline; a block whose input width equals the model width costs what any other does, so
pipelines that compare schedules set ``in_dim == width``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

from labkit.train.models.layout import Layout


def build_mlp(model: Any, seed: int, block_costs: Sequence[int] = ()) -> nn.Sequential:
    """Linear+ReLU blocks, identical on every rank for the same seed.

    Always initialised on the CPU (with the CPU generator), whatever the default device, so
    a GPU run starts from exactly the weights of the CPU reference; move it with ``.to``.
    """
    pairs = sum(block_costs) if block_costs else model.depth
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width_in = model.in_dim
    with torch.device("cpu"):
        for _ in range(pairs):
            layers += [nn.Linear(width_in, model.width), nn.ReLU()]
            width_in = model.width
        layers.append(nn.Linear(width_in, model.out_dim))
    net = nn.Sequential(*layers)
    net.block_costs = tuple(block_costs)  # type: ignore[assignment]  # read by mlp_layout
    torch.random.set_rng_state(gen_state)
    return net


def mlp_layout(net: nn.Sequential) -> Layout:
    """The MLP's blocks (``block_costs[i]`` Linear+ReLU pairs each, as it was built; one by
    default) and its classifier as the epilogue."""
    mods = list(net)
    head, pairs = mods[-1], (len(mods) - 1) // 2
    costs = list(getattr(net, "block_costs", ())) or [1] * pairs
    blocks: list[nn.Module] = []
    at = 0
    for cost in costs:
        blocks.append(nn.Sequential(*mods[at:at + 2 * cost]))
        at += 2 * cost
    width = int(cast(nn.Linear, head).in_features)
    return Layout(blocks=blocks, act_shape=lambda rows: (rows, width), epilogue=head,
                  epilogue_modules=[head])
