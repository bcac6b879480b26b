"""What every training loop does the same way inside a rank: a traced backward pass, and the
plain state and size of a model.

``traced_backward`` records ``loss.backward()`` as compute up to the last parameter
gradient, then as a wait (DDP blocks inside backward for its last all-reduce), so the
timeline shows real backward compute apart from exposed communication.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from labkit.base.events import Op

if TYPE_CHECKING:
    from labkit.rank.context import RankContext

_now = time.monotonic_ns


class BackwardClock:
    """Notes when autograd produced the last parameter gradient of a backward pass.

    ``loss.backward()`` may return later than that (DDP waits inside it for the final
    all-reduce). Splitting the call at the last gradient separates real backward compute
    from exposed communication.
    """

    def __init__(self, params: Iterable[torch.Tensor]):
        self.last_ns = 0
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, _p: torch.Tensor) -> None:
        self.last_ns = _now()


def traced_backward(ctx: RankContext, loss: torch.Tensor, clock: BackwardClock | None,
                    step: int) -> None:
    """``loss.backward()`` recorded as compute up to the last gradient, then as a wait."""
    tr = ctx.tracer
    if clock is None or ctx.device.type == "cuda":
        with tr.span(Op.BACKWARD, step=step):
            loss.backward()
        return
    start = _now()
    clock.last_ns = 0
    loss.backward()
    end = _now()
    last = clock.last_ns or end
    tr.record(Op.BACKWARD, start, last, step=step)
    if end - last > 20_000:
        tr.record(Op.WAIT, last, end, step=step)


def unwrap_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict without DDP's ``module.`` prefix, on CPU."""
    inner: Any = getattr(model, "module", model)
    return {k: v.detach().cpu() for k, v in inner.state_dict().items()}


def model_stats(model: nn.Module) -> tuple[int, int]:
    """(all parameters, matmul weights) of a plain module: the second is the N of the
    6N-FLOPs rule, the weights of every ``nn.Linear`` (``labkit.theory.training_flops``)."""
    total = sum(p.numel() for p in model.parameters())
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return total, matmul

