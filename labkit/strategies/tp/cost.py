"""What tensor parallelism must send, on paper (pure, no torch).

Megatron-LM (Shoeybi et al. 2019, section 3): a column-parallel linear followed by a
row-parallel linear needs the operator *g* (all-reduce of the partial outputs) once in
forward and the operator *f* (all-reduce of the input gradients) once in backward. Both move
one activation tensor of ``batch * seq * hidden`` values. An MLP is one such pair; attention
(heads split across ranks, output projection row-parallel) is another. So a transformer layer
with both costs 2 all-reduces forward + 2 backward.

Bytes here are the *payload* of each all-reduce (the tensor handed in, the convention of
``labkit.trace.comm``); a ring puts ``2(n-1)/n`` of that on the wire per rank.
"""

from __future__ import annotations

from labkit.theory.batch import check_choice, check_int
from labkit.theory.comm import ring_allreduce_bytes

BLOCK_PAIRS = {"both": 2, "mlp": 1, "attention": 1}


def tp_allreduces_per_layer(block: str = "both") -> dict[str, int]:
    """All-reduces per layer in forward (g) and backward (f): one per column/row pair."""
    check_choice("block", block, tuple(BLOCK_PAIRS), "block='both'")
    k = BLOCK_PAIRS[block]
    return {"forward": k, "backward": k}


def tp_bytes_per_layer(batch: int, seq: int, hidden: int, block: str = "both",
                       bytes_per_value: int = 4, world_size: int | None = None
                       ) -> dict[str, float]:
    """Payload bytes of one layer's all-reduces: ``count * batch * seq * hidden * bytes``.

    Keys ``forward``, ``backward``, ``total``; with ``world_size`` also ``wire_per_rank``,
    the bytes one rank sends for all of them in a ring (``2(n-1)/n`` x payload).
    """
    b = check_int("batch", batch, 1, "batch=8")
    s = check_int("seq", seq, 1, "seq=16")
    h = check_int("hidden", hidden, 1, "hidden=256")
    bpv = check_int("bytes_per_value", bytes_per_value, 1, "bytes_per_value=4")
    counts = tp_allreduces_per_layer(block)
    one = float(b * s * h * bpv)
    out = {"forward": counts["forward"] * one, "backward": counts["backward"] * one}
    out["total"] = out["forward"] + out["backward"]
    if world_size is not None:
        out["wire_per_rank"] = ring_allreduce_bytes(out["total"], world_size)
    return out
