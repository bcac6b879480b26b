"""Shared pieces every training strategy uses: the seeded model and data, the optimizer,
a traced backward pass, the single-process reference run and the parameter hash.

The synthetic task is a classification problem labelled by a fixed random "teacher"
MLP, generated from the seed, so nothing is downloaded and every run is reproducible. The
global batch of step ``s`` is a fixed slice of a seeded permutation of the dataset; data
rank ``r`` of ``n`` takes the ``r``-th contiguous shard of it. Because every rank averages
its own loss over an equal shard, averaging gradients across ranks gives exactly the
gradient of the global batch — the identity the DDP lessons check numerically.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from labkit.config import ModelConfig, RunConfig
from labkit.events import Op
from labkit.optim import make_optimizer

if TYPE_CHECKING:
    from labkit.rank import RankContext

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
    """The model a run trains, identical on every rank for the same seed."""
    return build_mlp(config.model, config.seed)


class SyntheticTask:
    """Seeded classification data: inputs ~ N(0, 1), labels from a random teacher MLP."""

    def __init__(self, seed: int, in_dim: int, out_dim: int, samples: int = 8192):
        g = torch.Generator().manual_seed(seed + 12345)
        cpu = torch.device("cpu")  # data lives on the CPU; ranks move their shard to a GPU
        self.x = torch.randn(samples, in_dim, generator=g, device=cpu)
        teacher_w1 = torch.randn(in_dim, 64, generator=g, device=cpu) / in_dim ** 0.5
        teacher_w2 = torch.randn(64, out_dim, generator=g, device=cpu) / 8.0
        self.y = (torch.tanh(self.x @ teacher_w1) @ teacher_w2).argmax(dim=1)
        self.samples = samples
        self.seed = seed

    def indices(self, step: int, global_batch: int) -> torch.Tensor:
        """Sample indices of step ``step``'s global batch (a new permutation every epoch)."""
        per_epoch = self.samples // global_batch
        if per_epoch < 1:
            raise ValueError(f"global batch ({global_batch}) exceeds the dataset "
                             f"({self.samples} samples)")
        epoch, pos = divmod(step, per_epoch)
        perm = torch.randperm(self.samples, device="cpu", generator=torch.Generator().manual_seed(
            self.seed * 7919 + epoch))
        return perm[pos * global_batch:(pos + 1) * global_batch]

    def batch(self, step: int, global_batch: int, shard: int = 0, shards: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shard ``shard`` of ``shards`` equal contiguous pieces of step ``step``'s batch."""
        idx = self.indices(step, global_batch)
        per = global_batch // shards
        idx = idx[shard * per:(shard + 1) * per]
        return self.x[idx], self.y[idx]


def task_for(config: RunConfig) -> SyntheticTask:
    return SyntheticTask(config.seed, config.model.in_dim, config.model.out_dim)


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


def reference_train(config: RunConfig, dp: int) -> dict[str, torch.Tensor]:
    """One process trains the same model on the global batch (``dp`` x ``batch_size``)."""
    model = build_mlp(config.model, config.seed)
    opt = make_optimizer(config.optimizer, model.parameters(), config.lr)
    task = task_for(config)
    for step in range(config.steps):
        x, y = task.batch(step, config.batch_size * dp)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
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

