"""The rules ``RunConfig(nodes=..., link=...)`` must follow, checked before any process starts."""

from __future__ import annotations

from typing import Any

from labkit.base.errors import ConfigError

MAX_NODES = 16


def config_problems(config: Any) -> list[str]:
    """Every broken rule of ``config.nodes`` / ``config.link`` (empty when fine)."""
    from labkit.base.netsupport import support
    from labkit.config.links import parse_link

    problems: list[str] = []
    nodes, link = config.nodes, config.link
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        return [f"nodes ({nodes!r}) must be an integer from 1 to {MAX_NODES}; e.g. nodes=2"]
    if isinstance(config.world_size, int) and config.world_size >= 1 \
            and config.world_size % nodes:
        problems.append(f"world_size ({config.world_size}) must be a multiple of nodes "
                        f"({nodes}) so every node runs as many ranks; e.g. world_size="
                        f"{nodes * max(1, config.world_size // nodes)}, nodes={nodes}")
    if link is not None:
        if nodes == 1:
            problems.append(f"link ({link!r}) needs nodes > 1: it is the wire between "
                            f"emulated nodes (ranks on one node share its loopback); "
                            f"e.g. nodes=2, link={link!r}")
        try:
            parse_link(link)
        except ConfigError as err:
            problems += err.problems
    if nodes > 1:
        if config.backend == "nccl":
            problems.append("backend 'nccl' cannot run on emulated nodes: they share this "
                            "machine's GPUs, and NCCL would talk through shared memory or "
                            "NVLink, around the shaped link; use backend='gloo' (or 'auto')")
        where = support()
        if not where.available:
            problems.append(f"nodes ({nodes}) > 1 needs emulated nodes, which are not "
                            f"available here: {where.reason} (`labkit doctor` says more)")
    return problems
