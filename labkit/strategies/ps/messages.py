"""What travels between parameter-server ranks: the request header and the flat model.

A worker's request is a float64 header ``[kind, step, read_version, loss]``; weights and
gradients travel as one flat float32 vector in ``model.parameters()`` order, cut into one
contiguous shard per server (``protocol.shard_bounds``).
"""

from __future__ import annotations

import torch

from labkit.strategies.ps.protocol import Kind


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """All parameters as one flat float32 vector, in ``model.parameters()`` order."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().float()


def header(kind: Kind, step: int, read_version: int = -1, loss: float = 0.0) -> torch.Tensor:
    return torch.tensor([float(kind), float(step), float(read_version), loss],
                        dtype=torch.float64)
