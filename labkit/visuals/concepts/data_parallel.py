"""Data parallelism in one picture, drawn before lesson 01 measures it: N replicas of one
model, each fed its own shard of the global batch, their gradients averaged by one
all-reduce, and the same update applied everywhere.

The picture of PyTorch DDP's design paper (Li et al. 2020, "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", Figure 1), drawn our own way with the
lesson's numbers: a global batch of N x B samples cut into N contiguous shards (rank r takes
samples r*B .. (r+1)*B - 1, as ``labkit.train.data`` shards them), a local gradient g_r per
rank, and the mean (g_0 + ... + g_{N-1}) / N that every rank receives back. Because every
replica starts from the same weights and applies the same mean, they stay identical -- and
equal to one process on the whole batch, since the mean of the shards' mean gradients is
the whole batch's mean gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SHARD, REPLICA, AVERAGE = "#F2C14E", "#4C9BE8", "#D62728"


def mean_formula(world_size: int) -> str:
    """"(g0 + g1 + g2) / 3"; from 5 ranks on, "(g0 + ... + g4) / 5"."""
    n = world_size
    terms = " + ".join(f"g{r}" for r in range(n)) if n <= 4 else f"g0 + ... + g{n - 1}"
    return f"({terms}) / {n}"


def plot_data_parallel(world_size: int = 2, batch_per_rank: int = 32) -> Figure:
    """Shards (gid ``"shard r"``), replicas (``"replica r"``) and the all-reduce (``"average"``)
    as boxes; an arrow per shard into its replica (``"feed r"``), per replica into the average
    (``"grad r"``) and back (``"update r"``)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    n, b = world_size, batch_per_rank
    if n < 1 or b < 1:
        raise ValueError(f"world_size ({n}) and batch_per_rank ({b}) must be >= 1; "
                         f"e.g. plot_data_parallel(2, 32)")
    fig, ax = plt.subplots(figsize=(2.2 + 2.4 * n, 4.2))
    plt.close(fig)
    width = 3.0 * n

    def box(x: float, y: float, w: float, h: float, color: str, text: str, gid: str) -> None:
        patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                               facecolor=color, edgecolor="black", linewidth=0.8, alpha=0.9)
        patch.set_gid(gid)
        ax.add_patch(patch)
        ax.text(x, y, text, ha="center", va="center", fontsize=8)

    def arrow(a: tuple[float, float], z: tuple[float, float], gid: str, color: str) -> None:
        patch = FancyArrowPatch(a, z, arrowstyle="-|>", mutation_scale=10, color=color, lw=1.2)
        patch.set_gid(gid)
        ax.add_patch(patch)

    ax.text(width / 2, 4.75, f"global batch: {n} x {b} = {n * b} samples", ha="center",
            fontsize=9, fontweight="bold")
    for r in range(n):
        x = 1.5 + 3.0 * r
        box(x, 4.1, 2.4, 0.55, SHARD, f"shard {r}: samples\n{r * b}..{(r + 1) * b - 1}",
            f"shard {r}")
        box(x, 2.6, 2.4, 1.0, REPLICA, f"rank {r}: full copy of W\nforward, backward\n"
                                       f"on shard {r} -> g{r}", f"replica {r}")
        arrow((x, 3.8), (x, 3.15), f"feed {r}", "black")
        arrow((x - 0.4, 2.05), (width / 2 - 0.3 * (n - 1) + 0.6 * r - 0.2, 1.05), f"grad {r}",
              AVERAGE)
        arrow((width / 2 - 0.3 * (n - 1) + 0.6 * r + 0.2, 1.05), (x + 0.4, 2.05),
              f"update {r}", REPLICA)
    box(width / 2, 0.6, min(width - 0.6, 5.2), 0.8, "#F7D6D6",
        f"all-reduce, then / {n}:  mean g = {mean_formula(n)}\n"
        f"every rank: W <- W - lr x mean g (the same update)", "average")
    ax.set_xlim(0, width)
    ax.set_ylim(0, 5.0)
    ax.axis("off")
    ax.set_title(f"Data parallelism on {n} ranks: replicas stay identical", fontsize=10)
    fig.tight_layout()
    return fig
