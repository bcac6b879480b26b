"""The ring all-reduce, step by step, drawn before lesson 01 runs it: what every rank holds of
every chunk after each step of the reduce-scatter and of the all-gather.

Patarasuk and Yuan 2009 ("Bandwidth optimal all-reduce algorithms for clusters of
workstations") and NCCL's ring follow the same plan; this is our own drawing of it. The
tensor is cut into n chunks. Reduce-scatter step s (s = 0 .. n-2): rank r sends chunk
(r - s) mod n to its right neighbour and adds the chunk (r - s - 1) mod n that arrives from
its left one; afterwards rank r holds the full sum of chunk (r + 1) mod n. All-gather step s:
rank r sends chunk (r - s + 1) mod n and overwrites chunk (r - s) mod n with what arrives.
This is the indexing of lesson 01's hand-written ring and of
``labkit.strategies.collectives.ring``, so the picture is the plan the run then executes.

Each panel is one moment (start, then after every step): a row per rank, a column per
chunk; a cell names the ranks whose numbers the chunk holds ("0+2"), filled darker the more
it holds, "Σ" when it holds them all; the chunk each rank sends in that step is outlined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Held = list[list[frozenset[int]]]
"""held[rank][chunk]: the ranks whose numbers that rank's copy of the chunk has summed."""


def ring_plan(n: int) -> list[tuple[str, Held, list[int]]]:
    """Every moment of a ring all-reduce on ``n`` ranks: (title, held after it, the chunk each
    rank sent in it). The first moment is the start (nothing sent: -1)."""
    if n < 2:
        raise ValueError(f"n ({n}) must be >= 2: a ring needs a neighbour; e.g. n=3")
    held: Held = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    out: list[tuple[str, Held, list[int]]] = [("start", held, [-1] * n)]
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            before, held = held, [row[:] for row in held]
            sent = []
            for r in range(n):
                left = (r - 1) % n
                if phase == "reduce-scatter":
                    sent.append((r - s) % n)
                    c = (r - s - 1) % n
                    held[r][c] = before[r][c] | before[left][c]  # add what arrives
                else:
                    sent.append((r - s + 1) % n)
                    c = (r - s) % n
                    held[r][c] = before[left][c]  # copy the finished chunk
            out.append((f"{phase} step {s + 1}", held, sent))
    return out


def cell_text(ranks: frozenset[int], n: int) -> str:
    """"Σ" for a chunk summed over all ``n`` ranks, else its ranks joined by "+"."""
    return "Σ" if len(ranks) == n else "+".join(str(r) for r in sorted(ranks))


def plot_ring_steps(n: int = 3) -> Figure:
    """One panel per moment of the ring on ``n`` ranks; every cell is a rectangle with gid
    ``"m{moment}/r{rank}/c{chunk}"`` (and ``"/sent"`` when the rank sends it in that step)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    plan = ring_plan(n)
    steps = len(plan) - 1  # the moments after the start: theory.comm's ring_allreduce_steps
    fig, axes = plt.subplots(1, len(plan), figsize=(2.1 * len(plan), 0.7 + 0.55 * n))
    plt.close(fig)
    cmap = plt.get_cmap("Blues")
    for m, (ax, (title, held, sent)) in enumerate(zip(axes, plan)):
        for r in range(n):
            for c in range(n):
                ranks = held[r][c]
                full = len(ranks) == n
                box = Rectangle((c, n - 1 - r), 1, 1, facecolor=cmap(0.15 + 0.7 * len(ranks) / n),
                                edgecolor="#D62728" if sent[r] == c else "white",
                                linewidth=2.5 if sent[r] == c else 1.0)
                box.set_gid(f"m{m}/r{r}/c{c}" + ("/sent" if sent[r] == c else ""))
                ax.add_patch(box)
                ax.text(c + 0.5, n - 0.5 - r, cell_text(ranks, n), ha="center", va="center",
                        fontsize=9, color="white" if full else "black",
                        fontweight="bold" if full else "normal")
        ax.set_xlim(0, n)
        ax.set_ylim(0, n)
        ax.set_aspect("equal")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([c + 0.5 for c in range(n)], [f"chunk {c}" for c in range(n)], fontsize=7)
        ax.set_yticks([n - 0.5 - r for r in range(n)], [f"rank {r}" for r in range(n)]
                      if m == 0 else [""] * n, fontsize=8)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    fig.suptitle(f"Ring all-reduce on {n} ranks: each step every rank sends one chunk (red "
                 f"outline, S/{n} bytes) to its right neighbour; {steps} steps = "
                 f"2(n-1)/n x S = {steps}/{n} S per rank", fontsize=9)
    fig.tight_layout()
    return fig
