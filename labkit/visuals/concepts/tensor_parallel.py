"""The picture of tensor parallelism before any run: Megatron's column / row split of an MLP.

What this teaches (Shoeybi et al. 2019, Megatron-LM, section 3 and figure 3): the MLP
``Z = GELU(X A) B`` runs on ``t`` ranks without gathering anything in between. ``A``
[h, 4h] is split by **columns**: rank r keeps ``A_r`` [h, 4h/t] and computes its own slice
``Y_r = GELU(X A_r)`` [tokens, 4h/t] (GELU acts on each value alone, so a slice needs no
talk). ``B`` [4h, h] is split by **rows**: ``B_r`` [4h/t, h] turns that slice into a
*partial* output ``Z_r = Y_r B_r`` [tokens, h], and the real output is the sum over ranks.
Two operators carry the communication: **f** before the pair (identity forward, all-reduce
of dX backward) and **g** after it (all-reduce of the partial outputs forward, identity
backward).

Drawn with the shapes of the lesson's run (tokens = b·s = 128, h = 512, t = 2). Each piece
carries a ``gid`` (``X``, ``A``, ``A slice``, ``Y``, ``B``, ``B slice``, ``Z partial``,
``Z``, ``f``, ``g``) so a test can count what the figure shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.analysis.plots import COLORS, new_figure
from labkit.base.errors import ConfigError
from labkit.base.events import Op

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

RANK_COLORS = ("#4E79A7", "#59A14F", "#B07AA1", "#EDC948", "#76B7B2", "#FF9DA7", "#9C755F",
               "#BAB0AC")
OTHER = "#E6E6E6"
ROW = 2.3  # height of one rank's band
ALL_REDUCE = COLORS[Op.ALL_REDUCE]


def _check(tokens: int, hidden: int, ranks: int) -> None:
    problems = [f"{name} ({value!r}) must be an integer >= 1; e.g. {name}={example}"
                for name, value, example in (("tokens", tokens, 128), ("hidden", hidden, 512),
                                             ("ranks", ranks, 2))
                if not isinstance(value, int) or isinstance(value, bool) or value < 1]
    if not problems and (4 * hidden) % ranks:
        problems.append(f"4 x hidden ({4 * hidden}) must be divisible by ranks ({ranks}): "
                        f"every rank keeps an equal share of the columns; e.g. ranks=2")
    if problems:
        raise ConfigError(problems)


def _box(ax: Axes, x: float, y: float, w: float, h: float, color: str, gid: str,
         label: str = "", text_color: str = "black") -> None:
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="#555555", gid=gid))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=7,
                color=text_color)


def _split(ax: Axes, x: float, y: float, w: float, h: float, parts: int, mine: int,
           by_columns: bool, name: str, color: str) -> None:
    """The whole matrix, cut into ``parts`` stripes; this rank's stripe coloured."""
    for k in range(parts):
        if by_columns:
            sx, sy, sw, sh = x + k * w / parts, y, w / parts, h
        else:  # by rows, first rows on top
            sx, sy, sw, sh = x, y + h - (k + 1) * h / parts, w, h / parts
        _box(ax, sx, sy, sw, sh, color if k == mine else OTHER, f"{name} slice")
    ax.add_patch(_outline(x, y, w, h, name))


def _outline(x: float, y: float, w: float, h: float, gid: str) -> Rectangle:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, fill=False, edgecolor="black", linewidth=1.2, gid=gid)


def _operator(ax: Axes, x: float, y: float, name: str, forward: str, backward: str) -> None:
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, y), 0.32, facecolor="white", edgecolor=ALL_REDUCE, linewidth=2,
                        gid=name))
    ax.text(x, y, name, ha="center", va="center", fontsize=12, weight="bold", color=ALL_REDUCE)
    ax.text(x, y - 0.45, f"fwd: {forward}\nbwd: {backward}", ha="center", va="top",
            fontsize=7, color=ALL_REDUCE)


def _line(ax: Axes, a: tuple[float, float], b: tuple[float, float]) -> None:
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, color="#555555",
                                 linewidth=1.2, gid="flow"))


def plot_tp_split(tokens: int = 128, hidden: int = 512, ranks: int = 2) -> Figure:
    """Megatron's MLP on ``ranks`` ranks with the shapes of ``tokens`` (b·s) rows of width
    ``hidden``: one band per rank (A by columns, B by rows, this rank's stripe coloured),
    f where X enters, g where the partial outputs are summed."""
    _check(tokens, hidden, ranks)
    t, h, inner = ranks, hidden, 4 * hidden // ranks
    top = ROW * t + 0.3
    fig = new_figure((12.0, 1.6 + 1.15 * ROW * t))
    ax = fig.add_subplot()
    mid = ROW * t / 2
    _box(ax, 0.0, mid - 0.35, 1.3, 0.7, "#DDDDDD", "X", f"X [{tokens}, {h}]")
    _operator(ax, 2.0, mid, "f", "identity", "all-reduce dX")
    _operator(ax, 11.4, mid, "g", "all-reduce Σ Z_r", "identity")
    _line(ax, (1.3, mid), (1.68, mid))
    for r in range(t):
        y = ROW * (t - 1 - r) + 0.45  # rank 0 on top
        c = RANK_COLORS[r % len(RANK_COLORS)]
        ax.text(3.5, y + 1.3, f"rank {r}", fontsize=9, weight="bold", color=c)
        _line(ax, (2.32, mid), (2.95, y + 0.6))
        ax.text(3.2, y + 0.6, "X ×", ha="center", va="center", fontsize=10)
        _split(ax, 3.5, y + 0.1, 1.8, 1.0, t, r, True, "A", c)
        ax.text(4.4, y - 0.15, f"A_{r} [{h}, {inner}]\ncolumns {r} of A", ha="center",
                va="top", fontsize=7)
        ax.text(5.6, y + 0.6, "→", ha="center", va="center", fontsize=12)
        _box(ax, 5.9, y + 0.3, 1.3, 0.6, c, "Y", f"Y_{r} [{tokens}, {inner}]", "white")
        ax.text(6.55, y + 0.05, "GELU on its own slice", ha="center", va="top", fontsize=7)
        ax.text(7.5, y + 0.6, "×", ha="center", va="center", fontsize=12)
        _split(ax, 7.75, y + 0.0, 0.9, 1.2, t, r, False, "B", c)
        ax.text(8.2, y - 0.15, f"B_{r} [{inner}, {h}]\nrows {r} of B", ha="center",
                va="top", fontsize=7)
        ax.text(8.95, y + 0.6, "→", ha="center", va="center", fontsize=12)
        _box(ax, 9.2, y + 0.3, 1.4, 0.6, "white", "Z partial", f"Z_{r} [{tokens}, {h}]\npartial")
        _line(ax, (10.6, y + 0.6), (11.1, mid))
    _line(ax, (11.72, mid), (12.2, mid))
    _box(ax, 12.2, mid - 0.35, 1.5, 0.7, "#DDDDDD", "Z", f"Z = Σ Z_r [{tokens}, {h}]")
    ax.set_title(f"Megatron's MLP on t = {t} ranks: A [{h}, {4 * h}] split by columns, "
                 f"B [{4 * h}, {h}] by rows; one all-reduce of [{tokens}, {h}] forward (g) "
                 f"and one backward (f)", fontsize=9)
    ax.set(xlim=(-0.1, 13.8), ylim=(-0.6, top))
    ax.axis("off")
    fig.tight_layout()
    return fig
