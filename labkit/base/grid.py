"""The rank grid: every run's ranks laid out on data x pipeline x context x tensor axes, with
an expert axis laid over the data ranks.

``world_size = dp x pp x cp x tp``. Ranks are numbered with the tensor axis fastest, then the
context axis, then the pipeline axis, then the data axis (picotron's
``arange(world).view(dp, pp, cp, tp)``)::

    rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank

The context-parallel axis (``cp``: the sequence split over ranks, ring attention) sits next to
the tensor axis, as in Megatron-LM's ``tp-cp-ep-dp-pp`` order: after TP it talks the most
(a K/V block per ring step per layer). The expert axis (``ep``) adds no ranks: it groups
``ep`` consecutive data-parallel ranks (``ep`` divides ``dp``; ``ep_rank = dp_rank % ep``),
which hold different experts of each MoE layer and the same copy of everything else, as
Megatron-LM and torchtitan lay experts over the data-parallel ranks.

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
"""The three axes of a 3D grid, slowest first: what lesson 09 and user code walk over (kept
as it was before ``cp`` and ``ep`` joined; a grid's full layout is ``LAYOUT_AXES``)."""
LAYOUT_AXES = ("dp", "pp", "cp", "tp")
"""The axes that lay out ranks, slowest first (``cp`` sits next to ``tp``)."""
GROUP_AXES = (*LAYOUT_AXES, "ep")
"""Every axis with its own groups: the layout axes and ``ep`` (over the data ranks)."""


@dataclass(frozen=True)
class Coords:
    """Where one rank sits on the grid."""

    dp: int
    pp: int
    tp: int
    cp: int = 0
    ep: int = 0
    """The rank's expert-parallel index (``dp % ep``)."""

    def __getitem__(self, axis: str) -> int:
        return int(getattr(self, axis))


@dataclass(frozen=True)
class Grid:
    """Sizes of the axes; ``Grid(dp=2, pp=2, tp=2)`` holds 8 ranks, ``Grid(dp=2, cp=2, tp=2)``
    too, ``Grid(dp=4, ep=2)`` 4 (ep lies over dp)."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    cp: int = 1
    """Context-parallel ranks (the sequence split over them; ring attention)."""
    ep: int = 1
    """Expert-parallel ranks, laid over the data-parallel ones (must divide ``dp``)."""

    def __post_init__(self) -> None:
        bad = [f"{a} ({getattr(self, a)!r})" for a in GROUP_AXES
               if not isinstance(getattr(self, a), int) or isinstance(getattr(self, a), bool)
               or getattr(self, a) < 1]
        if bad:
            raise ConfigError(f"grid sizes {', '.join(bad)} must be integers >= 1; "
                              f"e.g. Grid(dp=2, pp=2, tp=2)")
        if self.dp % self.ep:
            raise ConfigError(f"ep ({self.ep}) must divide dp ({self.dp}): experts are laid "
                              f"over the data-parallel ranks; e.g. Grid(dp=4, ep=2)")

    @classmethod
    def along(cls, axis: str, world_size: int) -> Grid:
        """All ``world_size`` ranks on one axis (the grid of a single-strategy run)."""
        if axis not in LAYOUT_AXES:
            raise ConfigError(f"axis {axis!r} must be one of {', '.join(LAYOUT_AXES)}")
        return cls(**{axis: world_size})

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    def size(self, axis: str) -> int:
        return int(getattr(self, axis))

    def coords(self, rank: int) -> Coords:
        """``rank`` -> (dp_rank, pp_rank, tp_rank, cp_rank, ep_rank), tp fastest."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank ({rank}) must be in 0..{self.world_size - 1} for {self}")
        dp, rest = divmod(rank, self.pp * self.cp * self.tp)
        pp, rest = divmod(rest, self.cp * self.tp)
        cp, tp = divmod(rest, self.tp)
        return Coords(dp, pp, tp, cp, dp % self.ep)

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0, cp: int = 0, ep: int | None = None
             ) -> int:
        """(dp_rank, pp_rank, tp_rank, cp_rank) -> the global rank (``ep``, if given, must be
        ``dp % ep``: the expert index follows from the data index)."""
        if ep is not None and ep != dp % self.ep:
            raise ConfigError(f"ep_rank ({ep}) must be dp_rank % ep ({dp} % {self.ep} = "
                              f"{dp % self.ep}) on {self}")
        return ((dp * self.pp + pp) * self.cp + cp) * self.tp + tp

    def group(self, axis: str, rank: int) -> list[int]:
        """The global ranks of ``rank``'s group on ``axis`` (its own coordinates elsewhere),
        ordered by their coordinate on that axis: index i is the axis-rank i. An ``ep`` group
        is ``ep`` consecutive data-parallel ranks."""
        c = self.coords(rank)
        if axis == "ep":
            first = c.dp - c.ep
            return [self.rank(dp=first + i, pp=c.pp, tp=c.tp, cp=c.cp) for i in range(self.ep)]
        fixed = {a: c[a] for a in LAYOUT_AXES if a != axis}
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
        return [a for a in GROUP_AXES if self.size(a) > 1]

    def as_dict(self) -> dict[str, int]:
        """``{"dp", "pp", "tp"}`` sizes, with ``cp`` and ``ep`` when they are split (the
        timeline's and the metrics' ``grid``)."""
        out = {"dp": self.dp, "pp": self.pp, "tp": self.tp}
        out.update({a: self.size(a) for a in ("cp", "ep") if self.size(a) > 1})
        return out

    def __str__(self) -> str:
        cp = f" x cp{self.cp}" if self.cp > 1 else ""
        ep = f" (ep{self.ep} over dp)" if self.ep > 1 else ""
        return f"dp{self.dp} x pp{self.pp}{cp} x tp{self.tp}{ep}"
