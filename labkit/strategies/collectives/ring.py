"""All-reduce built by hand from point-to-point messages: the ring, and two naive schemes.

Teaches the algorithm NCCL and gloo use for large messages (Patarasuk and Yuan 2009,
"Bandwidth optimal all-reduce algorithms for clusters of workstations"; Baidu's
ring-allreduce write-up, 2017). The tensor is cut into n chunks. Each rank sends to its right
neighbour and receives from its left one:

1. reduce-scatter, n-1 steps: in step s rank r sends chunk (r - s) mod n and adds the chunk
   (r - s - 1) mod n it receives into its own copy. Afterwards rank r holds the full sum of
   chunk (r + 1) mod n.
2. all-gather, n-1 steps: the finished chunks travel once more around the ring, each
   receiver overwriting its stale copy.

Every rank sends 2(n-1) chunks, i.e. ``2(n-1)/n`` x the tensor, however many ranks there
are. The naive alternatives for contrast: every rank sends its tensor to rank 0, which sums
and sends the result back ((n-1) x the tensor through rank 0), or every rank sends its
tensor to every other rank ((n-1) x the tensor per rank).

Every message goes through ``ctx.comm`` (``isend`` / ``irecv``), so each one is a traced
span: ``name`` = phase and ring step ("RS0", "AG1"), ``chunk``, ``peer`` and ``bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from labkit.trace.comm import Comm

RECORD_LIMIT = 64  # record full values per step only for tensors up to this many elements


class RingRecorder:
    """What one rank saw during one ring all-reduce, for the animation and the stepper.

    ``values[k]``: this rank's whole tensor after stage k (0: before the first step);
    ``transfers``: one dict per chunk this rank sent: phase, step, src, dst, chunk, bytes.
    """

    def __init__(self) -> None:
        self.values: list[list[float]] = []
        self.transfers: list[dict[str, Any]] = []
        self.bounds: list[tuple[int, int]] = []

    def snapshot(self, flat: torch.Tensor) -> None:
        if flat.numel() <= RECORD_LIMIT:
            self.values.append([float(v) for v in flat.detach().cpu().tolist()])

    def to_dict(self) -> dict[str, Any]:
        return {"values": self.values, "transfers": self.transfers,
                "bounds": [list(b) for b in self.bounds]}


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """[start, end) of each of the n chunks; the first ``numel % n`` chunks get one extra."""
    base, extra = divmod(numel, world_size)
    out, start = [], 0
    for i in range(world_size):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def _exchange(comm: Comm, send: torch.Tensor, recv: torch.Tensor, right: int, left: int,
              **meta: Any) -> None:
    """Send to the right neighbour and receive from the left one at the same time.

    The receive is posted first, so the left neighbour's message lands in a buffer that is
    already waiting even when this rank is slow to send (a slow link stays visible as a
    slow SEND on its own rank instead of stalling its neighbour's send too).
    """
    handles = []
    if recv.numel():
        handles.append(comm.irecv(recv, left, **meta))
    if send.numel():
        handles.append(comm.isend(send, right, **meta))
    for h in handles:
        h.wait()


def ring_allreduce(comm: Comm, tensor: torch.Tensor, *, step: int | None = None,
                   recorder: RingRecorder | None = None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place with a ring; returns ``tensor``.

    Works for any number of elements (chunks differ by at most one element when the size is
    not divisible by the world size; a chunk may be empty and is then skipped by both sides).
    """
    n, r = comm.world_size, comm.rank
    if not tensor.is_contiguous():
        raise ValueError("ring_allreduce needs a contiguous tensor; call .contiguous() first")
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), n)
    chunks = [flat[a:b] for a, b in bounds]
    right, left = (r + 1) % n, (r - 1) % n
    if recorder is not None:
        recorder.bounds = bounds
        recorder.snapshot(flat)
    # 1. reduce-scatter: n-1 steps, each adds one received chunk into ours
    for s in range(n - 1):
        send_c, recv_c = (r - s) % n, (r - s - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        _exchange(comm, chunks[send_c], incoming, right, left, step=step, name=f"RS{s}",
                  chunk=send_c)
        chunks[recv_c].add_(incoming)
        _note(recorder, "reduce-scatter", s, r, right, send_c, chunks[send_c], flat)
    # 2. all-gather: n-1 steps, each overwrites one stale chunk with a finished one
    for s in range(n - 1):
        send_c, recv_c = (r + 1 - s) % n, (r - s) % n
        _exchange(comm, chunks[send_c], chunks[recv_c], right, left, step=step,
                  name=f"AG{s}", chunk=send_c)
        _note(recorder, "all-gather", s, r, right, send_c, chunks[send_c], flat)
    return tensor


def _note(recorder: RingRecorder | None, phase: str, s: int, src: int, dst: int, chunk: int,
          sent: torch.Tensor, flat: torch.Tensor) -> None:
    if recorder is None:
        return
    recorder.transfers.append({"phase": phase, "step": s, "src": src, "dst": dst,
                               "chunk": chunk, "bytes": sent.numel() * sent.element_size()})
    recorder.snapshot(flat)


def reduce_broadcast_allreduce(comm: Comm, tensor: torch.Tensor, *, step: int | None = None,
                               root: int = 0) -> torch.Tensor:
    """Naive all-reduce: everyone sends to ``root``, which sums and sends the result back."""
    n, r = comm.world_size, comm.rank
    if r != root:
        # 1. hand my tensor to the root, 2. wait for the sum
        comm.send(tensor, root, step=step, name="to-root")
        comm.recv(tensor, root, step=step, name="from-root")
        return tensor
    # 1. receive and add every other rank's tensor (in rank order: same sum on every run)
    acc = torch.zeros_like(tensor)
    incoming = torch.empty_like(tensor)
    for src in range(n):
        if src == root:
            acc.add_(tensor)
            continue
        comm.recv(incoming, src, step=step, name="to-root")
        acc.add_(incoming)
    tensor.copy_(acc)
    # 2. send the sum to every other rank: (n-1) x the tensor leaves the root
    for dst in range(n):
        if dst != root:
            comm.send(tensor, dst, step=step, name="from-root")
    return tensor


def all_to_all_allreduce(comm: Comm, tensor: torch.Tensor, *, step: int | None = None
                         ) -> torch.Tensor:
    """Naive all-reduce: every rank sends its whole tensor to every other rank and sums."""
    n, r = comm.world_size, comm.rank
    mine = tensor.detach().clone()
    received = {src: torch.empty_like(tensor) for src in range(n) if src != r}
    # 1. post every send and receive at once, 2. sum all n tensors in rank order
    handles = [comm.isend(mine, dst, step=step, name="all-to-all") for dst in range(n) if dst != r]
    handles += [comm.irecv(buf, src, step=step, name="all-to-all") for src, buf in received.items()]
    for h in handles:
        h.wait()
    tensor.zero_()
    for src in range(n):
        tensor.add_(mine if src == r else received[src])
    return tensor


ALGORITHMS: dict[str, Callable[..., torch.Tensor]] = {
    "ring": ring_allreduce, "reduce_broadcast": reduce_broadcast_allreduce,
    "all_to_all": all_to_all_allreduce}


def record_ring(ctx: Any, numel: int = 8, *, seed: int = 0) -> dict[str, Any]:
    """Run one small ring all-reduce on this rank and return its recording.

    Each rank starts from small integers (rank r holds ``(r + 1) * [1, 2, ...]`` plus a seeded
    jitter), so the students can follow the sums by eye. Use with ``labkit.launch``:
    ``labkit.launch(record_ring, 3, 6)``; ``labkit.visuals.dp.ring_record`` merges the ranks.
    """
    g = torch.Generator().manual_seed(seed * 100 + ctx.rank)
    base = torch.arange(1, numel + 1, dtype=torch.float32) * (ctx.rank + 1)
    tensor = base + torch.randint(0, 3, (numel,), generator=g).float()
    rec = RingRecorder()
    start = tensor.clone()
    ring_allreduce(ctx.comm, tensor, recorder=rec)
    out = rec.to_dict()
    out.update(rank=ctx.rank, world_size=ctx.world_size, start=start.tolist(),
               result=tensor.tolist())
    return out


SCHEME_STEPS = {"ring": 0, "reduce_broadcast": 1, "all_to_all": 2}


def compare_schemes(ctx: Any, numel: int = 250_000) -> dict[str, float]:
    """Run the ring and both naive all-reduces on one fp32 tensor (traced as steps 0, 1, 2).

    For ``labkit.launch(compare_schemes, 4)``; ``labkit.visuals.dp.bytes_per_scheme`` reads
    the bytes each rank sent out of the timeline. Returns each scheme's max error vs the ring.
    """
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(numel, generator=g)
    out = {}
    ref = ring_allreduce(ctx.comm, x.clone(), step=SCHEME_STEPS["ring"])
    for name in ("reduce_broadcast", "all_to_all"):
        got = ALGORITHMS[name](ctx.comm, x.clone(), step=SCHEME_STEPS[name])
        out[name] = float((got - ref).abs().max())
    return out
