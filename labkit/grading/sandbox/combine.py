"""What a collective gives each rank, computed by the grader from every rank's part.

The relay (:mod:`relay`) does the collectives of a relayed exercise itself, with the
semantics of ``torch.distributed`` as ``labkit.trace.comm.Comm`` calls it: ``all_reduce``
(sum, avg, max, min, product), ``reduce_scatter`` (reduce, then chunk ``r`` to rank ``r``),
``all_gather`` (concatenate in rank order), ``broadcast`` (the ``src`` rank's tensor) and
``barrier``. Parts that do not fit together (other dtypes or sizes, other reductions, a
different ``src``) are an error every rank receives, as a real collective would fail.
"""

from __future__ import annotations

from typing import Any

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
"""The collectives a relayed rank may call (their names are ``labkit.base.events.Op`` values)."""
REDUCE = ("sum", "avg", "max", "min", "product")


def combine(kind: str, frames: dict[int, dict[str, Any]], parts: dict[int, Any],
             outs: dict[int, int], n: int, torch: Any) -> dict[int, Any]:
    """Each rank's answer to one collective, computed from every rank's part."""
    if kind == "barrier":
        return dict.fromkeys(frames)
    if kind == "broadcast":
        roots = {f.get("root") for f in frames.values()}
        root = next(iter(roots))
        if len(roots) != 1 or not isinstance(root, int) or not 0 <= root < n:
            raise ValueError("broadcast: every rank must name the same src rank, got "
                             f"{sorted(map(str, roots))}")
        return dict.fromkeys(frames, parts[root])
    shapes = {(p.dtype, p.numel()) for p in parts.values()}
    if len(shapes) != 1:
        raise ValueError(f"{kind}: every rank must pass a tensor of the same dtype and size, "
                         f"got {sorted(map(str, shapes))}")
    stack = torch.stack([parts[r] for r in range(n)])
    if kind == "all_gather":
        whole = stack.reshape(-1)
        if any(o != whole.numel() * whole.element_size() for o in outs.values()):
            raise ValueError(f"all_gather: output must hold world_size x input = {whole.numel()} "
                             "values")
        return dict.fromkeys(frames, whole)
    reduce = {f.get("reduce", "sum") for f in frames.values()}
    if len(reduce) != 1:
        raise ValueError(f"{kind}: the ranks asked for different reductions {sorted(reduce)}")
    op = reduce.pop()
    total = {"sum": stack.sum(0), "avg": stack.sum(0) / n, "max": stack.amax(0),
             "min": stack.amin(0), "product": stack.prod(0)}[op].to(stack.dtype)
    if kind == "all_reduce":
        return dict.fromkeys(frames, total)
    if total.numel() % n:  # reduce_scatter
        raise ValueError(f"reduce_scatter: input of {total.numel()} values is not world_size "
                         f"({n}) equal chunks")
    chunks = total.chunk(n)
    return {r: chunks[r] for r in frames}
