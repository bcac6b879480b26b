"""The parameter server's push and pull, drawn before lesson 11 measures anything.

One server rank holds the weights w (all ``params`` of them, 4 bytes each in fp32); each of
the W worker ranks holds a copy of the model and its own shard of every batch. A synchronous
(BSP) step is four phases, numbered on the arrows as the lesson's mechanism cell numbers them:

1. every worker computes a gradient g_k on its shard (the server computes nothing);
2. **push**: every worker sends g_k to the server (4 x params bytes each);
3. the server applies the mean of the W gradients once: w <- w - lr x (g_1 + ... + g_W) / W;
4. **pull**: every worker receives the new w (4 x params bytes each).

So the server's link carries 2 x W x 4 x params bytes per step, growing with the workers,
where a ring all-reduce sends about 2 x 4 x params per rank whatever their number (Li et al.
2014, *Scaling Distributed Machine Learning with the Parameter Server*; lesson 01's ring).
The figure prints those numbers for the run the lesson is about to make.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from labkit.analysis.plots import new_figure
from labkit.visuals.axes import fmt_bytes

SERVER, WORKER = "#F28E2B", "#4C9BE8"
PUSH, PULL = "#E15759", "#59A14F"
BYTES_PER_PARAM = 4
"""fp32: what the lesson's weights and gradients travel as."""


def server_bytes_per_step(workers: int, params: int, bytes_per_param: int = BYTES_PER_PARAM) -> int:
    """Bytes through the server per synchronous step: W pushes in, W pulls out, each the
    whole model."""
    return 2 * workers * params * bytes_per_param


def _box(ax: Axes, x: float, y: float, w: float, h: float, color: str, title: str,
         lines: list[str]) -> None:
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02",
                                fc=color, ec="#333", alpha=0.25, lw=1.2))
    ax.text(x, y + h / 2 - 0.06, title, ha="center", va="top", fontsize=10, weight="bold")
    ax.text(x, y - 0.04, "\n".join(lines), ha="center", va="center", fontsize=8.5)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], color: str,
           label: str, side: float, at: float) -> None:
    """An arrow from ``start`` to ``end``, its label beside the point ``at`` of the way (and
    on the patch: ``get_label()`` says "push" or "pull")."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.8,
                                 color=color, shrinkA=0, shrinkB=0, label=label.split()[1]))
    x, y = start[0] + at * (end[0] - start[0]), start[1] + at * (end[1] - start[1])
    ax.text(x + side, y, label, color=color, fontsize=8.5, ha="left" if side > 0 else "right",
            va="center")


MAX_WORKERS = 6
"""More boxes than this would not fit side by side."""


def plot_parameter_server(*, workers: int, params: int, batch_per_worker: int, lr: float) -> Figure:
    """The server, its W workers, and the four phases of one BSP step with this run's bytes.

    ``params``: the model's parameters (the server holds all of them); ``batch_per_worker``:
    samples in each worker's shard of a step's batch; ``lr``: the server's SGD step.
    """
    if not 1 <= workers <= MAX_WORKERS or params < 1 or batch_per_worker < 1:
        raise ValueError(f"workers ({workers}) must be 1..{MAX_WORKERS}, params ({params}) and "
                         f"batch_per_worker ({batch_per_worker}) >= 1; e.g. workers=2, params=22026")
    message = params * BYTES_PER_PARAM
    fig = new_figure((11, 4.6))
    ax = fig.add_subplot()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    top, bottom = 0.8, 0.25
    _box(ax, 0.5, top, 0.4, 0.3, SERVER, "server (rank 0)",
         [f"holds w: {params:,} parameters of {BYTES_PER_PARAM} B ({fmt_bytes(message)})",
          f"3. w <- w - {lr:g} x (g_1 + ... + g_{workers}) / {workers}",
          "computes no gradient"])
    slot = 1 / workers
    for k in range(1, workers + 1):
        x = (k - 0.5) * slot
        _box(ax, x, bottom, min(0.26, 0.8 * slot), 0.26, WORKER, f"worker {k} (rank {k})",
             ["a copy of the model", f"shard {k} of each batch:", f"{batch_per_worker} samples",
              f"1. computes g_{k}"])
        hub = 0.5 + (x - 0.5) * 0.5  # where this worker's arrows meet the server box
        gap = min(0.03, 0.12 * slot)
        _arrow(ax, (x - gap, bottom + 0.14), (hub - gap, top - 0.16), PUSH,
               f"2. push g_{k}", side=-0.008, at=0.3)
        _arrow(ax, (hub + gap, top - 0.16), (x + gap, bottom + 0.14), PULL,
               "4. pull w", side=0.008, at=0.7)
    ax.text(0.5, 0.0, f"every push and every pull carries the whole model: {fmt_bytes(message)}"
            f" ({params:,} x {BYTES_PER_PARAM} B)", ha="center", va="bottom", fontsize=9)
    ax.set_title(f"A parameter server and {workers} worker{'s' * (workers > 1)}: one synchronous "
                 f"(BSP) step, phases 1-4", fontsize=10.5)
    fig.tight_layout()
    return fig
