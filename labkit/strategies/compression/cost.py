"""Bytes a compressed gradient exchange should put on the wire, computed from the shapes.

Pure (no torch), so tests and notebooks can state the prediction before a run.

* fp16 / bf16: the same all-reduce on 2-byte values: exactly half of fp32.
* PowerSGD (Vogels et al. 2019; torch's ``powerSGD_hook``): each gradient is viewed as a
  matrix ``(shape[0], rest)``; with rank ``r' = min(rows, cols, r)`` it is sent as
  P (rows x r') and Q (cols x r') — two all-reduces — *if* that saves enough:
  ``(rows + cols) * r' * min_compression_rate < rows * cols`` (torch's rule, default rate 2).
  Other tensors (biases, thin matrices) are all-reduced uncompressed.
* top-k: each rank all-gathers k values and k int32 indices per bucket, so one rank's
  payload grows with the world size: ``n * k * 8`` bytes gathered per bucket.
* random-k: the k positions come from a seed all ranks share, so no index travels: one
  all-reduce of k fp32 values per bucket, ``4k`` bytes.
* int8: one all-reduce of a 4-byte max per bucket (the shared scale), then the bucket as
  int8: ``numel + 4`` bytes per bucket, a quarter of fp32.

Payload follows ``labkit.trace.comm``: the input of an all-reduce, the gathered output of an
all-gather. ``wire`` = what one rank sends in a ring: ``2(n-1)/n`` x all-reduce payload,
``(n-1)/n`` x all-gather payload.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod


def _matrix(shape: Sequence[int]) -> tuple[int, int]:
    rows = int(shape[0]) if shape else 1
    return rows, prod(int(s) for s in shape) // max(rows, 1)


def powersgd_values(shapes: Sequence[Sequence[int]], rank: int,
                    min_compression_rate: float = 2.0) -> dict[str, int]:
    """Values all-reduced per step by PowerSGD: ``uncompressed``, ``p``, ``q``, ``total``."""
    unc = p = q = 0
    for shape in shapes:
        rows, cols = _matrix(shape)
        r = min(rows, cols, rank)
        if (rows + cols) * r * min_compression_rate < rows * cols:
            p, q = p + rows * r, q + cols * r
        else:
            unc += rows * cols
    return {"uncompressed": unc, "p": p, "q": q, "total": unc + p + q}


def allreduce_wire(payload: float, world_size: int) -> float:
    """Bytes one rank sends in a ring all-reduce of ``payload`` (``labkit.theory.comm``)."""
    from labkit.theory.comm import BUSBW_FACTORS  # not at the top: see labkit.trace.comm

    return BUSBW_FACTORS["all_reduce"](world_size) * payload


def allgather_wire(payload: float, world_size: int) -> float:
    """Bytes one rank sends in a ring all-gather of ``payload`` in all."""
    from labkit.theory.comm import BUSBW_FACTORS

    return BUSBW_FACTORS["all_gather"](world_size) * payload


def predicted_payload_bytes(method: str, shapes: Sequence[Sequence[int]], world_size: int, *,
                            rank: int = 2, bucket_numels: Sequence[int] = (),
                            topk_ratio: float = 0.01, randomk_ratio: float = 0.01
                            ) -> dict[str, float]:
    """Predicted payload and per-rank wire bytes of one step's gradient exchange.

    ``bucket_numels`` (values per DDP bucket) is needed for top-k, random-k and int8: k is
    taken per bucket as ``max(1, int(ratio * numel))``; int8 sends one scale per bucket.
    """
    numel = sum(prod(int(s) for s in shape) for shape in shapes)
    if method == "none":
        payload = 4.0 * numel
    elif method in ("fp16", "bf16"):
        payload = 2.0 * numel
    elif method == "powersgd":
        payload = 4.0 * powersgd_values(shapes, rank)["total"]
    elif method == "topk":
        ks = [max(1, int(topk_ratio * b)) for b in bucket_numels]
        payload = float(sum(world_size * k * 8 for k in ks))
        return {"payload": payload, "wire": allgather_wire(payload, world_size)}
    elif method == "randomk":
        payload = float(sum(4 * max(1, int(randomk_ratio * b)) for b in bucket_numels))
    elif method == "int8":
        payload = float(numel + 4 * len(bucket_numels))
    else:
        raise ValueError(f"method {method!r} must be none, fp16, bf16, powersgd, topk, "
                         "randomk or int8")
    return {"payload": payload, "wire": allreduce_wire(payload, world_size)}
