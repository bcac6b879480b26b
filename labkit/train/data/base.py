"""What every dataset offers a training loop: seeded global batches split across data ranks."""

from __future__ import annotations

import torch
from torch import nn


class Task:
    """A fixed training set ``x``, ``y`` and the rule that turns a step into a batch.

    Subclasses fill ``x`` (inputs), ``y`` (targets), ``seed``; the batch order is a pure
    function of (seed, step, global batch), so a resumed or re-sharded run sees exactly the
    batches the original would have.
    """

    x: torch.Tensor
    y: torch.Tensor
    seed: int

    @property
    def samples(self) -> int:
        return int(self.x.shape[0])

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

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the samples (and positions) of the batch."""
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    @property
    def tokens_per_sample(self) -> int:
        """Positions that carry a loss in one sample (1 unless it is a sequence)."""
        return int(self.y[0].numel()) if self.y.dim() > 1 else 1
