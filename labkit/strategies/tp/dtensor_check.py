"""Cross-check: torch's own tensor parallelism (DTensor ``parallelize_module``) on the same MLP.

``ColwiseParallel`` shards ``fc`` by output features and ``RowwiseParallel`` shards ``proj``
by input features, exactly Megatron's split; torch inserts the all-reduce itself. (The
metric keys keep the names fc1 / fc2 of the first and second MLP linear.) Its
collectives go through torch's functional collectives, not ``labkit.trace.comm``, so they are not
on the timeline; ``CommDebugMode`` counts them instead. Runs on CPU with gloo.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from labkit.rank.context import RankContext
from labkit.train.models.gpt import MLP


def dtensor_mlp_check(ctx: RankContext, mlp: MLP, seed: int, batch: int, seq: int
                      ) -> dict[str, Any]:
    """Forward + backward of the MLP sharded by DTensor vs unsharded; max abs diffs and comm counts."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    hidden = mlp.fc.in_features
    g = torch.Generator().manual_seed(seed + 777)
    x = torch.randn(batch, seq, hidden, generator=g)
    x_ref, x_tp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref: Any
    ref = copy.deepcopy(mlp)
    ref_out = ref(x_ref)
    ref_out.sum().backward()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    sharded: Any = parallelize_module(copy.deepcopy(mlp), mesh,
                                 {"fc": ColwiseParallel(), "proj": RowwiseParallel()})
    counter = CommDebugMode()
    with counter:
        out = sharded(x_tp)
        out.sum().backward()
    grad = sharded.fc.weight.grad
    full_grad = grad.full_tensor() if isinstance(grad, DTensor) else grad
    local = sharded.fc.weight.to_local() if isinstance(sharded.fc.weight, DTensor) else None
    counts = {str(k).split(".")[-1]: int(v) for k, v in counter.get_comm_counts().items()}
    assert x_tp.grad is not None and x_ref.grad is not None
    return {"max_abs_diff_output": float((out - ref_out).abs().max()),
            "max_abs_diff_input_grad": float((x_tp.grad - x_ref.grad).abs().max()),
            "max_abs_diff_fc1_grad": float((full_grad - ref.fc.weight.grad).abs().max()),
            "fc1_local_shape": list(local.shape) if local is not None else None,
            "comm_counts": counts}


