"""The picture of a pipeline before any run: a model cut into stages, microbatches flowing.

What this teaches (lesson 03, GPipe: Huang et al. 2019; 1F1B: Narayanan et al. 2021): the
layers of one model are cut into ``p`` contiguous stages, one per rank; the batch is split
into ``m`` microbatches; at every cut a microbatch's **activation** travels forward (F) to
the next stage and, later, the **gradient** of that activation travels back (B). So a step
sends ``m (p - 1)`` activations and as many gradients, and no weights at all.

Drawn from the numbers the lesson then runs (p = 2 stages of its 8-layer MLP), with the
colours the measured timelines use for forward and backward. Each drawn piece carries a
``gid`` (``microbatch``, ``stage``, ``layer``, ``head``, ``activation``, ``gradient``) so a
test can count what the figure shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.analysis.plots import COLORS, new_figure
from labkit.base.errors import ConfigError
from labkit.base.events import Op
from labkit.schedules.partition import bounds_by_count

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MICROBATCH_COLORS = ("#4E79A7", "#59A14F", "#EDC948", "#B07AA1", "#76B7B2", "#FF9DA7",
                     "#9C755F", "#BAB0AC")
STAGE_FILL = "#F3F3F3"


def _check(stages: int, layers: int, microbatches: int) -> None:
    problems = [f"{name} ({value!r}) must be an integer >= 1; e.g. {name}={example}"
                for name, value, example in (("stages", stages, 2), ("layers", layers, 8),
                                             ("microbatches", microbatches, 4))
                if not isinstance(value, int) or isinstance(value, bool) or value < 1]
    if not problems and layers < stages:
        problems.append(f"layers ({layers}) must be >= stages ({stages}): every stage needs a "
                        f"layer; e.g. layers={2 * stages}")
    if problems:
        raise ConfigError(problems)


def _batch(ax: Axes, microbatches: int, batch: int | None) -> None:
    """The batch as ``m`` stacked microbatches, left of the first stage."""
    from matplotlib.patches import Rectangle

    height = 3.0 / microbatches
    for i in range(microbatches):
        y = 3.5 - (i + 1) * height
        ax.add_patch(Rectangle((0.2, y), 1.0, height, facecolor=MICROBATCH_COLORS[
            i % len(MICROBATCH_COLORS)], edgecolor="white", linewidth=1.5, gid="microbatch"))
        if height >= 0.25:
            ax.text(0.7, y + height / 2, f"mb {i}", ha="center", va="center", fontsize=8,
                    color="white")
    rows = f"\n{batch // microbatches} rows each" if batch else ""
    ax.text(0.7, 3.65, f"batch\n{microbatches} microbatches{rows}", ha="center", va="bottom",
            fontsize=8)


def _stage(ax: Axes, x0: float, width: float, s: int, lo: int, hi: int, last: bool) -> None:
    """One rank's stage: its layers side by side (and the classifier on the last)."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    ax.add_patch(FancyBboxPatch((x0, 0.4), width, 3.2, boxstyle="round,pad=0.05",
                                facecolor=STAGE_FILL, edgecolor="#555555", gid="stage"))
    ax.text(x0 + width / 2, 3.75, f"rank {s} · stage {s}", ha="center", va="bottom",
            fontsize=9, weight="bold")
    pieces = [f"L{k + 1}" for k in range(lo, hi)] + (["head"] if last else [])
    slot = (width - 0.2) / len(pieces)
    for k, name in enumerate(pieces):
        x = x0 + 0.1 + k * slot
        ax.add_patch(Rectangle((x + 0.04, 0.9), slot - 0.08, 2.2, facecolor="white",
                               edgecolor="#777777", gid="head" if name == "head" else "layer"))
        ax.text(x + slot / 2, 2.0, name, ha="center", va="center", fontsize=7, rotation=90)
    what = f"layers {lo + 1}–{hi}" + (" + classifier" if last else "")
    ax.text(x0 + width / 2, 0.55, what, ha="center", va="bottom", fontsize=8)


def _arrow(ax: Axes, x0: float, x1: float, y: float, color: str, gid: str, label: str) -> None:
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch((x0, y), (x1, y), arrowstyle="-|>", mutation_scale=14,
                                 color=color, linewidth=2, gid=gid))
    ax.text((x0 + x1) / 2, y + (0.12 if y > 2 else -0.12), label, ha="center",
            va="bottom" if y > 2 else "top", fontsize=7, color=color)


def plot_pipeline_stages(stages: int = 2, layers: int = 8, microbatches: int = 4, *,
                         batch: int | None = None) -> Figure:
    """A model of ``layers`` layers cut into ``stages`` equal stages (one per rank), a batch
    (of ``batch`` rows, if given) split into ``microbatches``; at every cut an activation
    arrow forward (F) and a gradient arrow back (B)."""
    _check(stages, layers, microbatches)
    bounds = bounds_by_count(layers, stages)
    width, gap = max(1.6, 0.32 * (layers / stages + 1)), 1.5
    right = 1.9 + stages * width + (stages - 1) * gap + 1.2
    fig = new_figure((min(13.0, 1.2 + 0.75 * right), 3.9))
    ax = fig.add_subplot()
    _batch(ax, microbatches, batch)
    _arrow(ax, 1.3, 1.85, 2.0, "#555555", "input", "")
    fwd, bwd = COLORS[Op.FORWARD], COLORS[Op.BACKWARD]
    for s in range(stages):
        x0 = 1.9 + s * (width + gap)
        _stage(ax, x0, width, s, bounds[s], bounds[s + 1], s == stages - 1)
        if s < stages - 1:
            a, b = x0 + width + 0.1, x0 + width + gap - 0.1
            _arrow(ax, a, b, 2.7, fwd, "activation", "F: activation\nof microbatch i")
            _arrow(ax, b, a, 1.3, bwd, "gradient", "B: gradient of\nthat activation")
    end = 1.9 + stages * width + (stages - 1) * gap
    _arrow(ax, end + 0.1, end + 0.6, 2.0, "#555555", "output", "")
    ax.text(end + 0.65, 2.0, "loss", ha="left", va="center", fontsize=9)
    sends = microbatches * (stages - 1)
    ax.set_title(f"{layers} layers cut into p = {stages} stages (one per rank), the batch into "
                 f"m = {microbatches} microbatches\nper step: m·(p−1) = {sends} activations "
                 f"forward and {sends} gradients back, no weights", fontsize=9)
    ax.set(xlim=(0, right), ylim=(0.2, 4.6), aspect="equal")
    ax.axis("off")
    fig.tight_layout()
    return fig
