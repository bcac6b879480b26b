"""The optimizers every strategy trains with: SGD, momentum, Adam, LARS and LAMB.

``make_optimizer(name, params, lr)`` is the one place a strategy gets its optimizer from,
so ``RunConfig.optimizer`` means the same thing everywhere. SGD, momentum and Adam are
torch's; LARS and LAMB are written out here.

LARS and LAMB: layer-wise adaptive learning rates for very large batches.

Teaches: with a large batch the linear-scaling rule asks for a large learning rate, and a
single global rate is then too big for some layers and too small for others. Both optimizers
give each parameter tensor (a "layer") its own *trust ratio* ``||w|| / ||update||``, so a
step never moves a layer by more than a fixed fraction of its own size.

- LARS, You, Gitman and Ginsburg 2017, "Large Batch Training of Convolutional Networks"
  (arXiv:1708.03888): momentum SGD whose per-layer local LR is
  ``eta * ||w|| / (||g|| + wd * ||w||)``.
- LAMB, You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in
  76 minutes" (arXiv:1904.00962): Adam's update (with decoupled weight decay) scaled by
  ``||w|| / ||adam_update||``.

Biases and other 1-d tensors are excluded from the trust ratio (ratio 1), as both papers'
reference implementations do. A zero norm on either side also gives ratio 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from labkit.config.run import OPTIMIZERS


def _trust_ratio(w_norm: torch.Tensor, u_norm: torch.Tensor) -> torch.Tensor:
    ok = (w_norm > 0) & (u_norm > 0)
    return torch.where(ok, w_norm / u_norm.clamp_min(1e-30), torch.ones_like(w_norm))


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al. 2017), on top of momentum SGD.

    For each tensor ``w`` with gradient ``g`` (phase numbers match ``step``):
      1. ``d = g + weight_decay * w``
      2. ``local = eta * ||w|| / (||g|| + weight_decay * ||w||)`` (1 for 1-d tensors)
      3. ``v = momentum * v + lr * local * d``;  ``w = w - v``
    """

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, eta: float = 0.001):
        if lr <= 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError(f"LARS needs lr ({lr}) > 0, momentum ({momentum}) >= 0, "
                             f"weight_decay ({weight_decay}) >= 0, eta ({eta}) > 0; "
                             f"e.g. LARS(params, lr=1.0)")
        super().__init__(params, {"lr": lr, "momentum": momentum,
                                  "weight_decay": weight_decay, "eta": eta})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, mom, wd, eta = group["lr"], group["momentum"], group["weight_decay"], group["eta"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                # 1. weight decay folded into the direction
                d = g.add(p, alpha=wd) if wd else g.clone()
                # 2. the layer's trust ratio
                if p.ndim > 1:
                    w_norm, g_norm = p.norm(), g.norm()
                    local = eta * _trust_ratio(w_norm, g_norm + wd * w_norm)
                else:
                    local = torch.ones((), dtype=p.dtype)
                # 3. momentum on the scaled step
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = torch.zeros_like(p)
                buf.mul_(mom).add_(d * (lr * local))
                p.sub_(buf)
        return loss


class LAMB(torch.optim.Optimizer):
    """Layer-wise Adaptive Moments for Batch training (You et al. 2019).

    For each tensor ``w`` at step ``t`` (phase numbers match ``step``):
      1. Adam moments ``m, v`` with bias correction ``m_hat, v_hat``
      2. ``u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w``
      3. ``w = w - lr * (||w|| / ||u||) * u`` (ratio 1 for 1-d tensors)
    """

    def __init__(self, params: Iterable[Any], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0):
        if lr <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or eps <= 0 or weight_decay < 0:
            raise ValueError(f"LAMB needs lr ({lr}) > 0, betas ({betas}) in [0, 1), eps ({eps}) "
                             f"> 0, weight_decay ({weight_decay}) >= 0; e.g. LAMB(params, lr=0.01)")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros(())
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                # 1. Adam's moments, bias-corrected
                state["step"] += 1
                t = float(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = m / (1 - b1 ** t)
                v_hat = v / (1 - b2 ** t)
                # 2. the Adam direction plus decoupled weight decay
                u = m_hat / (v_hat.sqrt() + eps)
                if wd:
                    u.add_(p, alpha=wd)
                # 3. layer-wise trust ratio
                ratio = _trust_ratio(p.norm(), u.norm()) if p.ndim > 1 else 1.0
                p.sub_(u * (lr * ratio))
        return loss


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """``RunConfig.optimizer`` -> the optimizer: sgd, momentum (SGD, momentum 0.9), adam,
    lars or lamb (You et al. 2017 / 2019, above)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "lars":
        return LARS(params, lr=lr)
    if name == "lamb":
        return LAMB(params, lr=lr)
    raise ValueError(f"optimizer {name!r} must be one of {', '.join(OPTIMIZERS)}")

