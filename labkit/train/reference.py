"""The single-process reference every strategy is checked against, and the end of a run.

What the lab claims for every parallelism is an identity: splitting the batch over data
ranks, the layers over pipeline stages, the matrices over tensor ranks or the model state
over ZeRO shards trains the same model as ONE process on the global batch -- only the
floating-point summation order differs. ``reference_run`` is that one process: the same
seeded model (the registry's ``build_model``, or a ``build`` of the caller's), the same
optimizer, the same batches, with hooks for what a strategy changes about the update (an
LR schedule, gradient clipping). It records what the checks compare: the final weights,
the loss of every step, the gradients and the output of the first step.

``finish_run`` is how every run ends, whichever strategy: the hash of the final
parameters (``params_sha256``, in name order, so a run split over stages or shards hashes
exactly what one process holding the same weights would), and with ``check_reference``
the largest difference from the reference; for the digits, the held-out accuracy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from labkit.train.data import DigitsTask, Task
from labkit.train.models import build_model, task_for
from labkit.train.optim import make_optimizer


@dataclass
class Reference:
    """What one process training on the global batch ended with."""

    state: dict[str, torch.Tensor]
    """The final weights, under the model's own names."""
    losses: list[float] = field(default_factory=list)
    """The loss of every step (before its update)."""
    first_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    """The gradients of step 0, by parameter name."""
    first_output: torch.Tensor | None = None
    """The model's output on step 0's batch."""


def reference_run(config: Any, *, dp: int = 1, global_batch: int | None = None,
                  build: Callable[[Any], nn.Module] | None = None, task: Task | None = None,
                  lr_at: Callable[[int], float] | None = None, clip_grad_norm: float = 0.0
                  ) -> Reference:
    """One process trains ``config``'s model on the global batch of every step.

    ``global_batch`` defaults to ``dp x batch_size``; ``build`` makes the model (default
    ``build_model``), ``task`` the data (default ``task_for``). Hooks: ``lr_at(step)`` sets
    the learning rate of each step (a warmup or a scaling rule), ``clip_grad_norm`` > 0
    clips the gradient norm before each update.
    """
    model = (build or build_model)(config)
    task = task if task is not None else task_for(config)
    batch = global_batch or config.batch_size * dp
    opt = make_optimizer(config.optimizer, model.parameters(),
                         lr_at(0) or 1.0 if lr_at is not None else config.lr)
    ref = Reference(state={})
    for step in range(config.steps):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
        x, y = task.batch(step, batch)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = task.loss(out, y)
        loss.backward()
        ref.losses.append(float(loss.detach()))
        if step == 0:
            ref.first_output = out.detach().clone()
            ref.first_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                               if p.grad is not None}
        if clip_grad_norm > 0:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        opt.step()
    ref.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return ref


def params_sha256(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over the names, shapes and bytes of the parameters, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        t = t.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute elementwise difference between two state dicts with the same keys."""
    return max(float((a[k].float() - b[k].float().to(a[k].device)).abs().max()) for k in a)


def held_out_accuracy(config: Any, task: DigitsTask, state: dict[str, torch.Tensor]) -> float:
    """Accuracy of the final weights ``state`` on the images the run never trained on."""
    model = build_model(config)
    model.load_state_dict(state)
    return task.accuracy(model)


def finish_run(state: dict[str, torch.Tensor], config: Any, record: Any, *,
               reference: Callable[[], dict[str, torch.Tensor]], task: Task | None = None
               ) -> str:
    """The end of every run, on the rank that holds the whole final ``state``: its hash;
    with ``check_reference``, ``record.max_abs_diff_vs_reference`` against ``reference()``
    (called only then: it trains one process); for the digits, ``record.accuracy`` on the
    held-out images (``task``: the run's data, built again if not given)."""
    if config.check_reference:
        record.max_abs_diff_vs_reference = max_abs_diff(state, reference())
    if config.model.kind == "digits":
        digits = task if isinstance(task, DigitsTask) else DigitsTask(config.seed)
        record.accuracy = held_out_accuracy(config, digits, state)
    return params_sha256(state.items())
