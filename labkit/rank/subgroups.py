"""A rank's sub-groups: one process group per grid axis, and the intra- / inter-node pair.

``new_subgroups_by_enumeration`` is collective: every rank must create every group of an
axis, in the same order, or the ranks wait for each other forever. Both builders follow
that rule; an axis (or node) of one rank gets a ``Comm`` that records nothing, and one that
holds every rank reuses the world group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from labkit.base.grid import Grid
    from labkit.trace.comm import Comm


def build_axis_comms(world: Comm, grid: Grid, cache: dict[tuple[Any, ...], Any] | None = None
                     ) -> dict[str, Comm]:
    """One ``Comm`` per axis of ``grid``, each on its own process group (step 2).

    An axis holding every rank reuses the world group; an axis of size 1 gets a ``Comm``
    over this rank alone (its collectives return at once and record nothing). A split axis'
    groups come from ``cache`` when an earlier job made them, else every rank creates every
    group of the axis, in the same order (a rule of ``new_group``).
    """
    import torch.distributed as dist

    from labkit.base.grid import GROUP_AXES

    out: dict[str, Comm] = {}
    for axis in GROUP_AXES:
        size = grid.size(axis)
        if size == 1:  # first: a one-rank world's axes too (it pays for no collective)
            out[axis] = world.on(axis, "solo", [world.rank])
        elif size == world.world_size:
            out[axis] = world.on(axis, None, list(range(world.world_size)))
        else:
            groups = grid.groups(axis)
            key = (axis, tuple(tuple(g) for g in groups))
            mine = cache.get(key) if cache is not None else None
            if mine is None:
                mine, _ = dist.new_subgroups_by_enumeration(groups)
                if cache is not None:
                    cache[key] = mine
            out[axis] = world.on(axis, mine, grid.group(axis, world.rank))
    return out


def build_node_comms(world: Comm, node_size: int) -> tuple[Comm, Comm]:
    """The two groups of a hierarchical collective, ranks contiguous per node (torchrun's
    numbering): intra = this rank's node, inter = the same local index on every node.
    A group of one rank gets a ``Comm`` that records nothing (as for a grid axis of size 1)."""
    import torch.distributed as dist

    n = world.world_size
    if node_size < 1 or n % node_size:
        raise ValueError(f"ranks_per_node ({node_size}) must divide world_size ({n})")
    nodes = n // node_size
    intra_groups = [list(range(k * node_size, (k + 1) * node_size)) for k in range(nodes)]
    inter_groups = [list(range(i, n, node_size)) for i in range(node_size)]
    comms = []
    for axis, groups in (("intra", intra_groups), ("inter", inter_groups)):
        mine = next(g for g in groups if world.rank in g)
        if len(mine) == 1:
            comms.append(world.on(axis, "solo", mine))
        elif len(mine) == n:
            comms.append(world.on(axis, None, mine))
        else:
            group, _ = dist.new_subgroups_by_enumeration(groups)
            comms.append(world.on(axis, group, mine))
    return comms[0], comms[1]
