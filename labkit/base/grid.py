"""The rank grid: every run's ranks laid out on three axes, data x pipeline x tensor.

``world_size = dp x pp x tp``. Ranks are numbered with the tensor axis fastest, then the
pipeline axis, then the data axis (picotron's ``arange(world).view(dp, pp, tp)``)::

    rank = dp_rank * (pp * tp) + pp_rank * tp + tp_rank

so the ``tp`` ranks of one tensor-parallel group are neighbours: started ``tp`` to a node,
a TP group never leaves its node, where the fast links are (TP talks every layer; pipeline
and data parallelism talk once per microbatch or per step and tolerate slower links).

Each axis has its own process groups: the ranks that differ only in that axis' coordinate
form one group. A single-strategy run is this grid with the other axes at 1 (DDP is
``dp = world_size``, a pipeline ``pp = world_size``).

Pure Python (no torch): the supervisor builds the grid to validate a config.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.base.errors import ConfigError

AXES = ("dp", "pp", "tp")
"""The axes in layout order, slowest first."""


@dataclass(frozen=True)
class Coords:
    """Where one rank sits on the grid."""

    dp: int
    pp: int
    tp: int

    def __getitem__(self, axis: str) -> int:
        return int(getattr(self, axis))


@dataclass(frozen=True)
class Grid:
    """Sizes of the three axes; ``Grid(dp=2, pp=2, tp=2)`` holds 8 ranks."""

    dp: int = 1
    pp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        bad = [f"{a} ({getattr(self, a)!r})" for a in AXES
               if not isinstance(getattr(self, a), int) or isinstance(getattr(self, a), bool)
               or getattr(self, a) < 1]
        if bad:
            raise ConfigError(f"grid sizes {', '.join(bad)} must be integers >= 1; "
                              f"e.g. Grid(dp=2, pp=2, tp=2)")

    @classmethod
    def along(cls, axis: str, world_size: int) -> Grid:
        """All ``world_size`` ranks on one axis (the grid of a single-strategy run)."""
        if axis not in AXES:
            raise ConfigError(f"axis {axis!r} must be one of {', '.join(AXES)}")
        return cls(**{axis: world_size})

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def size(self, axis: str) -> int:
        return int(getattr(self, axis))

    def coords(self, rank: int) -> Coords:
        """``rank`` -> (dp_rank, pp_rank, tp_rank), tp fastest."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank ({rank}) must be in 0..{self.world_size - 1} for {self}")
        dp, rest = divmod(rank, self.pp * self.tp)
        pp, tp = divmod(rest, self.tp)
        return Coords(dp, pp, tp)

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        """(dp_rank, pp_rank, tp_rank) -> the global rank."""
        return (dp * self.pp + pp) * self.tp + tp

    def group(self, axis: str, rank: int) -> list[int]:
        """The global ranks of ``rank``'s group on ``axis`` (its own coordinates elsewhere),
        ordered by their coordinate on that axis: index i is the axis-rank i."""
        c = self.coords(rank)
        fixed = {a: c[a] for a in AXES if a != axis}
        return [self.rank(**{**fixed, axis: i}) for i in range(self.size(axis))]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of ``axis``, in a fixed order every rank agrees on (for new_group)."""
        seen: list[list[int]] = []
        for r in range(self.world_size):
            g = self.group(axis, r)
            if g not in seen:
                seen.append(g)
        return seen

    def active_axes(self) -> list[str]:
        """The axes with more than one rank."""
        return [a for a in AXES if self.size(a) > 1]

    def __str__(self) -> str:
        return f"dp{self.dp} x pp{self.pp} x tp{self.tp}"
