"""Lesson 11's mechanism cell, checked: a synchronous (BSP) parameter server written on the
page with ``ctx.comm.send`` / ``recv``, set beside labkit's own (``labkit run ps
--consistency bsp``) and beside one process on the global batch.

The plumbing the check cell needs, so the cell shows only the comparison:

* ``MECHANISM_RUN``: the run both servers make (1 server + 2 workers, lesson 11's model,
  10 steps of 256 samples per worker, SGD at 0.4): the mechanism receives it as its argument
  and builds the same seeded model and data from it (``build_model``, ``task_for``);
* ``weights_sha256``: the hash labkit's server reports (``params_sha256``) of a flat weight
  vector such as the one the mechanism's server returns (lesson 12's Ray actor too);
* ``one_process_weights``: ``reference_run``'s weights (one process, the global batch),
  flat, and ``TOLERANCE``, the rounding the lab allows between the two
  (``labkit.theory.rounding``);
* ``server_bytes``: bytes the server rank sent and received per step, counted from the
  launch's trace (the prediction is ``visuals.concepts.parameter_server.server_bytes_per_step``).

With two workers the server's sum of gradients is the same in any arrival order (a + b ==
b + a in floating point), so the mechanism's server and labkit's end bit-identical: the same
``params_sha256``. One process sums the 512 samples' gradients in another order, so it
agrees only to rounding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from labkit.base.events import Op
from labkit.config.run import RunConfig
from labkit.lessons.async_ps import LESSON_MODEL
from labkit.theory.rounding import same_weights_tolerance
from labkit.train.models import build_model
from labkit.train.reference import params_sha256, reference_run

MECHANISM_RUN = RunConfig(strategy="ps", world_size=3, steps=10, lr=0.4, batch_size=256,
                          model=LESSON_MODEL, backend="gloo", timeout_s=120,
                          options={"servers": 1, "consistency": "bsp"})
"""1 server + 2 workers, BSP, 10 steps of 256 samples per worker, SGD at lr 0.4."""
TOLERANCE = same_weights_tolerance(MECHANISM_RUN.optimizer, MECHANISM_RUN.lr, MECHANISM_RUN.steps)
"""|w - one process| that float rounding explains for this run (4e-5)."""


def workers(config: RunConfig = MECHANISM_RUN) -> int:
    """Worker ranks: every rank that is not the (one) server."""
    return int(config.world_size - config.options.servers)


def model_params(config: RunConfig = MECHANISM_RUN) -> int:
    """Parameters of the run's model: what the server holds, and every push and pull carries."""
    return sum(p.numel() for p in build_model(config).parameters())


def weights_sha256(flat: torch.Tensor | np.ndarray, config: RunConfig = MECHANISM_RUN) -> str:
    """``params_sha256`` of the model whose parameters, in ``model.parameters()`` order, are
    ``flat`` (a tensor, or a numpy array such as a Ray actor returns, read-only included):
    the hash labkit's parameter server reports for its final weights."""
    if isinstance(flat, np.ndarray):
        flat = torch.from_numpy(np.array(flat, dtype=np.float32))  # a writable copy
    model = build_model(config)
    expected = sum(p.numel() for p in model.parameters())
    if flat.numel() != expected:
        raise ValueError(f"the weights have {flat.numel()} numbers, the model {expected}: return "
                         f"the server's whole flat vector w (rank 0's result)")
    torch.nn.utils.vector_to_parameters(flat.detach().float(), model.parameters())
    return params_sha256(model.named_parameters())


def one_process_weights(config: RunConfig = MECHANISM_RUN) -> torch.Tensor:
    """The weights of one process trained on the global batch (W x batch_size samples per
    step), flat in ``model.parameters()`` order."""
    model = build_model(config)
    model.load_state_dict(reference_run(config, dp=workers(config)).state)
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def server_bytes(result: Any, steps: int = MECHANISM_RUN.steps, server: int = 0) -> float:
    """Bytes the server rank sent plus received per step, counted in a launch's trace."""
    total = sum(e.bytes or 0 for e in result.timeline.events
                if e.rank == server and e.op in (Op.SEND, Op.RECV))
    return total / steps
