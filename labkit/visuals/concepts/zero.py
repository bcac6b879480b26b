"""ZeRO's partitions, drawn before lesson 05 measures them: what each data-parallel rank keeps
of the parameters, the gradients and the optimizer state, stage by stage.

Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models") draw this as their Figure 1; this is our own drawing of the same idea. One panel per
stage (0 = plain data parallelism); in each, one bar per rank, made of three blocks sized by
the bytes per parameter (2 + 2 + K under mixed precision, ``labkit.theory.bytes_per_param``).
A block the stage shards is cut into N_d slices: the rank keeps (fills) only its own slice and
the others are outlines, the bytes it no longer holds. The bytes per rank beside each bar are
``labkit.theory.zero_memory`` for one parameter, so the picture and the formula are one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.theory import bytes_per_param, zero_memory
from labkit.visuals.memory import TERM_COLORS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TERMS = ("params", "grads", "optimizer")
LABELS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state"}
SHARDED_FROM = {"optimizer": 1, "grads": 2, "params": 3}
"""The first stage that shards each term."""


def zero_partitions(world_size: int = 4, precision: str = "mixed",
                    optimizer: str = "adam") -> Figure:
    """Stages 0-3 side by side, ``world_size`` ranks each; every slice is one rectangle whose
    ``gid`` is ``"s{stage}/r{rank}/{term}/{slice}"`` (filled = kept by that rank)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    if world_size < 2:
        raise ValueError(f"world_size ({world_size}) must be >= 2: ZeRO shards over several "
                         f"data-parallel ranks; e.g. world_size=4")
    per = bytes_per_param(precision, optimizer)
    width = float(per["total"])
    fig, axes = plt.subplots(1, 4, figsize=(11, 0.5 + 0.45 * world_size), sharey=True)
    for stage, ax in enumerate(axes):
        kept = zero_memory(1.0, world_size, stage, precision, optimizer)["total"]
        for rank in range(world_size):
            y, left = world_size - 1 - rank, 0.0
            for term in TERMS:
                size = float(per[term])
                sharded = stage >= SHARDED_FROM[term]
                slices = world_size if sharded else 1
                for k in range(slices):
                    mine = not sharded or k == rank
                    box = Rectangle((left + k * size / slices, y - 0.35), size / slices, 0.7,
                                    facecolor=TERM_COLORS[term] if mine else "none",
                                    edgecolor=TERM_COLORS[term] if sharded else "white",
                                    linewidth=0.8, fill=mine, alpha=1.0 if mine else 0.6)
                    box.set_gid(f"s{stage}/r{rank}/{term}/{k}")
                    ax.add_patch(box)
                left += size
        ax.set_xlim(0, width)
        ax.set_ylim(-0.6, world_size - 0.4)
        ax.set_yticks(range(world_size), [f"rank {r}" for r in reversed(range(world_size))])
        ax.set_xticks([])
        ax.set_xlabel(f"{kept:.3g} B per parameter per rank")
        ax.set_title(f"ZeRO-{stage}" + (" (DDP)" if stage == 0 else ""), fontsize=10)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=TERM_COLORS[t], label=f"{LABELS[t]} ({per[t]} B/param)")
               for t in TERMS]
    handles.append(Patch(facecolor="none", edgecolor="grey", label="another rank's slice"))
    fig.legend(handles=handles, loc="upper center", ncol=4, frameon=False, fontsize=8,
               bbox_to_anchor=(0.5, 1.02))
    fig.suptitle(f"What each of {world_size} data-parallel ranks keeps ({precision} "
                 f"{optimizer})", y=1.1, fontsize=11)
    fig.tight_layout()
    plt.close(fig)
    return fig
