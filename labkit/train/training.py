"""Shared pieces every training strategy uses: the seeded model and data, a traced
backward pass, the single-process reference run and the parameter hash.

``build_model`` / ``task_for`` turn ``RunConfig.model`` into the model and its data
(``labkit.train.data``): the synthetic MLP task, the GPT on Python's own source, or the digits.
The global batch of step ``s`` is a fixed slice of a seeded permutation of the dataset; data
rank ``r`` of ``n`` takes the ``r``-th contiguous shard of it. Because every rank averages
its own loss over an equal shard, averaging gradients across ranks gives exactly the
gradient of the global batch — the identity the DDP lessons check numerically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from labkit.base.events import Op
from labkit.config.run import ModelConfig, RunConfig
from labkit.train.data import DigitsTask, SyntheticTask, Task, TextTask
from labkit.train.optim import make_optimizer

if TYPE_CHECKING:
    from labkit.rank.context import RankContext

_now = time.monotonic_ns


def build_mlp(model: ModelConfig, seed: int) -> nn.Sequential:
    """Linear+ReLU blocks, identical on every rank for the same seed.

    Always initialised on the CPU (with the CPU generator), whatever the default device, so
    a GPU run starts from exactly the weights of the CPU reference; move it with ``.to``.
    """
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width_in = model.in_dim
    with torch.device("cpu"):
        for _ in range(model.depth):
            layers += [nn.Linear(width_in, model.width), nn.ReLU()]
            width_in = model.width
        layers.append(nn.Linear(width_in, model.out_dim))
    net = nn.Sequential(*layers)
    torch.random.set_rng_state(gen_state)
    return net


def build_model(config: RunConfig) -> nn.Module:
    """The model a run trains (``config.model.kind``), identical on every rank for the same
    seed and always initialised on the CPU."""
    m = config.model
    if m.kind == "gpt":
        from labkit.train.data.text import vocab_size_of
        from labkit.train.models.gpt import build_gpt

        return build_gpt(vocab_size_of(m.vocab_size), m.width, m.depth, m.heads, m.seq_len,
                         config.seed)
    if m.kind == "digits":
        from labkit.train.data.digits import DigitsTask

        return build_mlp(dataclasses.replace(m, in_dim=DigitsTask.in_dim,
                                             out_dim=DigitsTask.classes), config.seed)
    return build_mlp(m, config.seed)


def task_for(config: RunConfig) -> Task:
    """The data of ``config.model.kind`` (``labkit.train.data``), the same on every rank."""
    m = config.model
    if m.kind == "gpt":
        return TextTask(config.seed, m.seq_len, m.vocab_size)
    if m.kind == "digits":
        return DigitsTask(config.seed)
    return SyntheticTask(config.seed, m.in_dim, m.out_dim)


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


def params_sha256(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over the names, shapes and bytes of the parameters, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        t = t.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def reference_train(config: RunConfig, dp: int,
                    build: Callable[[RunConfig], nn.Module] | None = None
                    ) -> dict[str, torch.Tensor]:
    """One process trains the same model on the global batch (``dp`` x ``batch_size``);
    ``build`` makes the model (default ``build_model``)."""
    model = (build or build_model)(config)
    opt = make_optimizer(config.optimizer, model.parameters(), config.lr)
    task = task_for(config)
    for step in range(config.steps):
        x, y = task.batch(step, config.batch_size * dp)
        opt.zero_grad(set_to_none=True)
        task.loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute elementwise difference between two state dicts with the same keys."""
    return max(float((a[k].float() - b[k].float().to(a[k].device)).abs().max()) for k in a)


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


def held_out_accuracy(config: RunConfig, task: DigitsTask, state: dict[str, torch.Tensor]
                      ) -> float:
    """Accuracy of the final weights ``state`` on the images the run never trained on."""
    model = build_model(config)
    model.load_state_dict(state)
    return task.accuracy(model)

