"""Common data-parallel mistakes, shown with real ranks (run with ``labkit.launch``).

* ``sampler_demo``: without ``DistributedSampler`` every rank loads the same samples, so N
  ranks do N x the work on 1 x the data; with the sampler but without ``set_epoch`` every
  epoch repeats the first epoch's order (the sampler seeds its shuffle with the epoch).
* ``batchnorm_demo``: BatchNorm normalises with the statistics of the *local* batch, so N
  ranks with batch b are not the same model as one process with batch N x b, and the
  running statistics differ per rank. Per-sample normalisation (LayerNorm / GroupNorm) or
  SyncBatchNorm (``syncbn``: the statistics all-reduced through ``ctx.comm``, their bytes
  on the timeline) removes the difference (seed 000: "synchronized BatchNorm (or GN)").
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from labkit.rank.context import RankContext
from labkit.train.data import Task
from labkit.train.reference import max_abs_diff, reference_run


def sampler_demo(ctx: RankContext, use_sampler: bool = True, set_epoch: bool = True,
                 epochs: int = 2, samples: int = 16, batch_size: int = 4) -> dict[str, Any]:
    """Load ``epochs`` epochs of a small indexed dataset; return the sample ids this rank saw."""
    data = TensorDataset(torch.arange(samples))
    sampler: DistributedSampler[Any] | None = (
        DistributedSampler(data, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                           seed=0) if use_sampler else None)
    seen: list[list[int]] = []
    for epoch in range(epochs):
        if sampler is not None and set_epoch:
            sampler.set_epoch(epoch)
        # without a sampler every rank shuffles with the same seed, as scripts usually do
        loader = DataLoader(data, batch_size=batch_size, sampler=sampler,
                            shuffle=sampler is None,
                            generator=torch.Generator().manual_seed(epoch) if sampler is None
                            else None)
        seen.append([int(i) for (batch,) in loader for i in batch])
    return {"rank": ctx.rank, "epochs": seen}


def duplicate_report(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per epoch: share of loaded samples that another rank also loaded; repeated orders."""
    epochs = len(results[0]["epochs"])
    dup, distinct = [], []
    for e in range(epochs):
        ids = [i for r in results for i in r["epochs"][e]]
        dup.append(1.0 - len(set(ids)) / len(ids))
        distinct.append(len(set(ids)))
    repeated = [all(r["epochs"][e] == r["epochs"][0] for r in results) for e in range(1, epochs)]
    return {"duplicate_fraction": dup, "distinct_samples": distinct,
            "loaded_per_epoch": [sum(len(r["epochs"][e]) for r in results) for e in range(epochs)],
            "epoch_repeats_first": repeated}


NORMS = ("batch", "syncbatch", "group", "layer")


def _norm_model(norm: str, seed: int, comm: Any = None) -> nn.Sequential:
    """The demo MLP with one normalisation layer; ``syncbatch`` needs the rank's ``comm``."""
    from labkit.strategies.dp.syncbn import SyncBatchNorm1d

    torch.manual_seed(seed)
    layer: nn.Module = {"batch": lambda: nn.BatchNorm1d(64),
                        "syncbatch": lambda: SyncBatchNorm1d(64, comm),
                        "group": lambda: nn.GroupNorm(8, 64),
                        "layer": lambda: nn.LayerNorm(64)}[norm]()
    return nn.Sequential(nn.Linear(16, 64), layer, nn.ReLU(), nn.Linear(64, 4))


class NormTask(Task):
    """The demo's data: 16 features ~ N(1, 2), four classes from the first two; a fresh
    global batch per step, each data rank taking its contiguous shard."""

    def batch(self, step: int, global_batch: int, shard: int = 0, shards: int = 1
              ) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(global_batch, 16, generator=g) * 2 + 1
        y = (x[:, 0] > 1).long() + 2 * (x[:, 1] > 1).long()
        per = global_batch // shards
        return x[shard * per:(shard + 1) * per], y[shard * per:(shard + 1) * per]


def batchnorm_demo(ctx: RankContext, norm: str = "batch", steps: int = 5,
                   batch_size: int = 4, lr: float = 0.1) -> dict[str, Any]:
    """Data-parallel SGD (gradients averaged via ``ctx.comm``) with one normalisation layer.

    ``norm``: batch (local statistics), syncbatch (global, all-reduced), group or layer.
    Returns this rank's running mean (the BatchNorms), the bytes SyncBN's own all-reduces
    put on the wire per step, and, on rank 0, the largest weight difference from one
    process training on the global batch (with plain BatchNorm for ``syncbatch``: that is
    the model SyncBN must reproduce).
    """
    if norm not in NORMS:
        raise ValueError(f"norm {norm!r} must be one of {', '.join(NORMS)}")
    model = _norm_model(norm, seed=0, comm=ctx.comm)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n, r, task = ctx.world_size, ctx.rank, NormTask()
    for step in range(steps):
        x, y = task.batch(step, batch_size * n, r, n)
        opt.zero_grad()
        if norm == "syncbatch":
            model[1].step = step  # type: ignore[assignment]  # labels its spans
        nn.functional.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            assert p.grad is not None
            ctx.comm.all_reduce(p.grad, op="avg", step=step)
        opt.step()
    out: dict[str, Any] = {"rank": r, "norm": norm}
    if norm in ("batch", "syncbatch"):
        out["running_mean"] = model[1].running_mean[:8].tolist()  # type: ignore[index]
    if norm == "syncbatch":
        sent = sum(e.bytes or 0 for e in ctx.events() if e.name == "syncbn")
        out["syncbn_bytes_per_step"] = sent / steps
    if r == 0:
        # one process on the global batch, with plain BatchNorm where SyncBN ran
        plain = "batch" if norm == "syncbatch" else norm
        setup = SimpleNamespace(optimizer="sgd", lr=lr, steps=steps, batch_size=batch_size)
        ref = reference_run(setup, dp=n, build=lambda _: _norm_model(plain, seed=0), task=task)
        out["max_abs_diff_vs_reference"] = max_abs_diff(
            {k: p.detach() for k, p in model.named_parameters()}, ref.state)
    return out


def all_mistakes(ctx: RankContext) -> dict[str, Any]:
    """Every demo in one launch (saves process start-ups in the notebook and the tests)."""
    return {"no_sampler": sampler_demo(ctx, False, False),
            "no_set_epoch": sampler_demo(ctx, True, False),
            "correct": sampler_demo(ctx, True, True),
            "batchnorm": batchnorm_demo(ctx, "batch"), "layernorm": batchnorm_demo(ctx, "layer"),
            "syncbatchnorm": batchnorm_demo(ctx, "syncbatch"),
            "groupnorm": batchnorm_demo(ctx, "group")}
