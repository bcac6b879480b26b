"""Gradient buckets: pack gradients as backward produces them, all-reduce each bucket early.

Backward produces gradients roughly in reverse order of the parameters (last layer first),
so buckets are filled in that order: bucket 0 holds the last layers' gradients and is ready
first. When a bucket's last gradient has been accumulated, its async all-reduce is launched
at once (from a post-accumulate-grad hook), and the wire works while autograd computes the
earlier layers. Buckets are launched strictly in index order, so every rank issues the same
collectives in the same order (a rule of collectives). ``wait_all`` at the end of backward
blocks only for what is still in flight: the *exposed* communication.

Follows the design of PyTorch DDP's Reducer (Li et al. 2020) and picotron's ``bucket.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from labkit.trace.comm import Comm, Handle


@dataclass
class Bucket:
    """A flat buffer holding the gradients of a few parameters, all-reduced as one message."""

    index: int
    params: list[tuple[str, nn.Parameter]]
    buffer: torch.Tensor
    offsets: list[int]
    pending: set[int] = field(default_factory=set)
    handle: Handle | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def reset(self) -> None:
        self.pending = set(range(len(self.params)))
        self.handle = None

    def add_grad(self, slot: int) -> bool:
        """Copy parameter ``slot``'s local gradient in; True when the bucket is full."""
        _, p = self.params[slot]
        assert p.grad is not None
        start = self.offsets[slot]
        self.buffer[start:start + p.numel()].copy_(p.grad.reshape(-1))
        self.pending.discard(slot)
        return not self.pending

    def unpack(self, world_size: int) -> None:
        """Write the summed buffer back into the gradients, divided by ``world_size``."""
        self.buffer.div_(world_size)
        for (_, p), start in zip(self.params, self.offsets):
            assert p.grad is not None
            p.grad.copy_(self.buffer[start:start + p.numel()].view_as(p.grad))


class BucketManager:
    """Owns the buckets of one model replica and launches their all-reduces from hooks."""

    def __init__(self, params: list[tuple[str, nn.Parameter]], comm: Comm, cap_bytes: float):
        if cap_bytes <= 0:
            raise ValueError(f"cap_bytes ({cap_bytes}) must be > 0, e.g. 25e6")
        self.comm = comm
        self.step = 0
        self.buckets = self._build(params, cap_bytes)
        self._next = 0  # the lowest bucket index not launched yet this step
        self._where: dict[int, tuple[Bucket, int]] = {}
        for b in self.buckets:
            for slot, (_, p) in enumerate(b.params):
                self._where[id(p)] = (b, slot)
                p.register_post_accumulate_grad_hook(self._on_grad)
        self.reset()

    @staticmethod
    def _build(params: list[tuple[str, nn.Parameter]], cap_bytes: float) -> list[Bucket]:
        # 1. walk the parameters backwards (the order backward produces gradients),
        # 2. close a bucket once it reaches the cap (a parameter is never split).
        groups: list[list[tuple[str, nn.Parameter]]] = [[]]
        size = 0
        for name, p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if groups[-1] and size + nbytes > cap_bytes:
                groups.append([])
                size = 0
            groups[-1].append((name, p))
            size += nbytes
        buckets = []
        for i, group in enumerate(groups):
            offsets, total = [], 0
            for _, p in group:
                offsets.append(total)
                total += p.numel()
            ref = group[0][1]
            buckets.append(Bucket(index=i, params=group, offsets=offsets,
                                  buffer=torch.zeros(total, dtype=ref.dtype, device=ref.device)))
        return buckets

    def reset(self) -> None:
        self._next = 0
        for b in self.buckets:
            b.reset()

    def _on_grad(self, p: torch.Tensor) -> None:
        bucket, slot = self._where[id(p)]
        if bucket.add_grad(slot):
            self._launch_ready()

    def _launch_ready(self) -> None:
        # launch in index order only: every rank must issue the same collectives in order
        while self._next < len(self.buckets) and not self.buckets[self._next].pending:
            b = self.buckets[self._next]
            b.handle = self.comm.all_reduce(b.buffer, async_op=True, step=self.step,
                                            bucket=b.index, name=f"bucket {b.index}")
            self._next += 1

    def wait_all(self) -> None:
        """Block until every bucket is reduced; gradients then hold the mean over ranks."""
        missing = [b.index for b in self.buckets if b.handle is None]
        if missing:
            raise RuntimeError(f"buckets {missing} never became ready: a parameter got no "
                               f"gradient in backward (unused parameters are not supported)")
        for b in self.buckets:
            assert b.handle is not None
            b.handle.wait()
            b.unpack(self.comm.world_size)
