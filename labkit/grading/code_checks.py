"""Grade code a student wrote by running it on N real ranks, part by part.

What is graded (problem set 3, "build it", after seeds 002 and 003):

* ``ring_all_reduce(ctx, tensor)``: sum ``tensor`` across ranks with ``ctx.comm.send`` /
  ``recv`` (or ``isend`` / ``irecv``) only, as a reduce-scatter then an all-gather around
  the ring. Parts: the sums for each world size; each rank SENDING ``2(n-1)/n`` of the
  tensor by point-to-point (read off the Timeline). Gates (fail one, score 0): no
  collective at all, counted where every route ends, the c10d operators
  (``dist.all_reduce``, ``ctx.comm.all_reduce`` and a direct ``ProcessGroup.allreduce``
  alike), and no call into labkit's own ring; during autograding also the bytes the box's
  own loopback interface carried, counted outside the box where the student's code cannot
  reach (a hidden all-reduce, even one hidden from the in-rank counter, doubles them).
* ``bucketed_allreduce`` and ``zero1_step``: see ``labkit.grading.sync_checks`` (their
  names are importable from here too);
* a 1F1B plan: see ``labkit.grading.plan_code``.

The student's function runs on real ranks (in the grading box during autograding); only
plain numbers come back, and the expected values are computed here from the inputs'
seed. ``check_*`` functions return a ``Verdict`` (all parts passed or not, with the
per-part feedback); ``*_question`` + ``add_*`` build the partial-credit questions the
notebooks use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labkit.analysis.timeline import Timeline
from labkit.base.events import Op
from labkit.grading import calls
from labkit.grading.checks import Verdict
from labkit.grading.parts import FORBIDDEN_HINT, Question
from labkit.grading.rank_checks import FORBID, compare, failure, gate, stub, window
from labkit.grading.sync_checks import (
    BUCKET_CAP,
    BUCKET_SIZES,
    add_buckets,
    add_zero1,
    bucket_question,
    check_bucketed_sync,
    check_zero1,
    expected_buckets,
    zero1_question,
)

RING_SIZES = (12, 13, 1001)  # divisible, odd, odd and larger
WIRE_SIZE = 1 << 18  # float64 elements: 2 MB, so the loopback count is mostly payload
ONLY_P2P = "built from send/recv only"

def ring_question(points: float = 4) -> Question:
    return Question("ring_all_reduce", points)


def add_ring(q: Question, fn: Callable[..., Any], world_sizes: Sequence[int] = (2, 3, 4),
             sizes: Sequence[int] = RING_SIZES, seed: int = 0, wire: bool = False) -> None:
    """Run the ring on each world size; record sums, timeline bytes and (``wire``) loopback."""
    from labkit.grading.rank_side import inputs

    name = "ring_all_reduce"
    all_sizes = list(sizes) + ([WIRE_SIZE] if wire else [])
    for n in world_sizes:
        sums = f"right sums on {n} ranks"
        if stub(q, sums, name):
            continue
        try:
            out = calls.launch(fn, "ring", n, [all_sizes, seed], FORBID)
        except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
            failure(q, sums, name, exc)
            continue
        results, timeline = out["results"], out["timeline"]
        if not gate(q, name, [rec for rank in results for rec in rank], ONLY_P2P):
            return
        for case, size in enumerate(all_sizes):
            want = sum(inputs(seed, case, r, size) for r in range(n))
            for rank in range(n):
                diff = compare(results[rank][case], want, seed + case)
                where = f"world_size={n}, tensor of {size} float64, rank {rank}"
                if isinstance(diff, str):
                    q.record(sums, False, f"{name} ({where}): the result {diff}. Sum in "
                             "place into `tensor` (or return the summed tensor).")
                else:
                    q.record(sums, diff <= 1e-9 * max(1, n) * (1 if size < 5000 else 100),
                             f"{name} ({where}) differs from dist.all_reduce by up to "
                             f"{diff:.3g}. Try: split into n chunks with torch.tensor_split; "
                             "in step k, send chunk (rank - k) % n to rank + 1 and add the "
                             "chunk received from rank - 1.")
            q.record("2(n-1)/n of the tensor per rank, by point-to-point",
                     _ring_bytes(name, timeline, results, n, case, size))
        if out["wire_bytes"] is not None and wire:
            q.record("the network carried a ring's bytes (counted outside the box)",
                     _wire(name, out["wire_bytes"], n, all_sizes), gate=True)


def _ring_bytes(name: str, timeline: Timeline, results: list[Any], n: int, case: int,
                size: int) -> Verdict:
    """Bytes each rank sent by point-to-point, from the Timeline, vs 2(n-1)/n x size."""
    elem = results[0][case]["element_bytes"]
    tensor_bytes = size * elem
    per_rank = []
    for rank in range(n):
        sends = [e for e in window(timeline, rank, case) if e.op == Op.SEND]
        traced = sum(e.bytes or 0 for e in sends)
        if results[rank][case]["sent_bytes"] > traced:
            return Verdict(False, f"{name} (world_size={n}, rank {rank}): "
                           f"{results[rank][case]['sent_bytes'] - traced} B were sent around "
                           "the traced ctx.comm, so the timeline cannot show them. Use "
                           "ctx.comm.send / isend and wait() every handle.")
        per_rank.append(traced)
    expected = 2 * (n - 1) / n * tensor_bytes
    slack = 2 * (n - 1) * elem  # chunks of sizes n does not divide differ by one element
    total_ok = sum(per_rank) == 2 * (n - 1) * tensor_bytes
    worst = max(per_rank, key=lambda b: abs(b - expected))
    if not total_ok or abs(worst - expected) > slack:
        return Verdict(False, f"{name} (world_size={n}, {size} elements = {tensor_bytes} B): "
                       f"ranks sent {per_rank} B by point-to-point; a ring sends "
                       f"2(n-1)/n x {tensor_bytes} = {expected:.0f} B per rank. Sending whole "
                       "tensors (or to every rank) moves more; send one 1/n chunk per step, "
                       "2(n-1) steps in all.")
    return Verdict(True, "bytes ok")


def _wire(name: str, measured: int, n: int, sizes: Sequence[int]) -> Verdict:
    """Loopback bytes of the whole launch vs what the ring's sends need (payload + setup)."""
    need = sum(2 * (n - 1) * s * 8 for s in sizes)
    setup = 512 * 1024  # process-group set-up, clock alignment, the grader's own barriers
    if need * 0.95 <= measured <= need * 1.4 + setup:
        return Verdict(True, "wire ok")
    return Verdict(False, f"{name} (world_size={n}): the box's network carried {measured} B "
                   f"while a ring needs about {need} B. More means extra traffic (a hidden "
                   "collective); less means data moved some other way than the network.")


def check_ring_allreduce(fn: Callable[..., Any], world_sizes: Sequence[int] = (2, 3, 4),
                         sizes: Sequence[int] = RING_SIZES, seed: int = 0) -> Verdict:
    """All ring parts as one Verdict (tests and scripts)."""
    q = ring_question()
    add_ring(q, fn, world_sizes, sizes, seed)
    return q.verdict()


__all__ = ["BUCKET_CAP", "BUCKET_SIZES", "FORBID", "FORBIDDEN_HINT", "add_buckets", "add_ring",
           "add_zero1", "bucket_question", "check_bucketed_sync", "check_ring_allreduce",
           "check_zero1", "expected_buckets", "ring_question", "zero1_question"]
