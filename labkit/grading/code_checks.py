"""Grade code a student wrote by running it on N real ranks, part by part.

What is graded (problem set 3, "build it", after seeds 002 and 003):

* ``ring_all_reduce(ctx, tensor)``: sum ``tensor`` across ranks with ``ctx.comm.send`` /
  ``recv`` (or ``isend`` / ``irecv``) only, as a reduce-scatter then an all-gather around
  the ring (Patarasuk and Yuan 2009: ``2(n-1)`` steps of one ``1/n`` chunk, the least any
  all-reduce must send). Parts: the sums for each world size; each rank sending
  ``2(n-1)/n`` of the tensor in ``2(n-1)`` messages. Gate (fail it, score 0): no collective.
  Each rank runs in a box of its own with no process group, and every message crosses the
  grader (:mod:`labkit.grading.sandbox.relay`), which counts bytes, messages and
  collectives itself: there is no second way between the ranks for a hidden all-reduce.
* ``bucketed_allreduce`` and ``zero1_step``: see ``labkit.grading.sync_checks`` (their
  names are importable from here too);
* a 1F1B plan: see ``labkit.grading.plan_code``.

The student's function runs on real rank processes; each rank gets only its own inputs,
drawn here, and only plain numbers come back; the expected values are computed here.
``check_*`` functions return a ``Verdict`` (all parts passed or not, with the per-part
feedback); ``*_question`` + ``add_*`` build the partial-credit questions the notebooks use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labkit.grading import calls
from labkit.grading.checks import Verdict
from labkit.grading.parts import FORBIDDEN_HINT, Question
from labkit.grading.rank_checks import FORBID, compare, failure, gate, inputs, stub
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
ONLY_P2P = "built from send/recv only"
BYTES = "2(n-1)/n of the tensor per rank, by point-to-point"

def ring_question(points: float = 4) -> Question:
    return Question("ring_all_reduce", points)


def add_ring(q: Question, fn: Callable[..., Any], world_sizes: Sequence[int] = (2, 3, 4),
             sizes: Sequence[int] = RING_SIZES, seed: int = 0) -> None:
    """Run the ring on each world size; record the sums and the bytes the grader relayed."""
    name = "ring_all_reduce"
    for n in world_sizes:
        sums = f"right sums on {n} ranks"
        if stub(q, sums, name):
            continue
        cases = [[inputs(seed, case, r, size) for case, size in enumerate(sizes)]
                 for r in range(n)]
        try:
            out = calls.launch(fn, "ring", n, [[cases[r]] for r in range(n)], FORBID)
        except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
            failure(q, sums, name, exc)
            continue
        results, record = out["results"], out["record"]
        if not gate(q, name, [rec for rank in results for rec in rank], record, ONLY_P2P):
            return
        for case, size in enumerate(sizes):
            want = sum(cases[r][case] for r in range(n))
            for rank in range(n):
                diff = compare(results[rank][case], want)
                where = f"world_size={n}, tensor of {size} float64, rank {rank}"
                if isinstance(diff, str):
                    q.record(sums, False, f"{name} ({where}): the result {diff}. Sum in "
                             "place into `tensor` (or return the summed tensor).")
                else:
                    q.record(sums, diff <= 1e-9 * max(1, n), f"{name} ({where}) differs "
                             f"from the sum over ranks by up to {diff:.3g}. Try: split into "
                             "n chunks with torch.tensor_split; in step k, send chunk "
                             "(rank - k) % n to rank + 1 and add the chunk received from "
                             "rank - 1.")
            q.record(BYTES, _ring_bytes(name, record, n, case, size * 8))
            q.record(BYTES, _carries_data(name, record, [cases[r][case] for r in range(n)], case))


def _ring_bytes(name: str, record: Any, n: int, case: int, tensor_bytes: int) -> Verdict:
    """Bytes and messages each rank sent (as the grader relayed them) vs a ring's."""
    per_rank = [record.sent_bytes.get((rank, case), 0) for rank in range(n)]
    messages = [record.messages.get((rank, case), 0) for rank in range(n)]
    expected = 2 * (n - 1) / n * tensor_bytes
    slack = 2 * (n - 1) * 8  # chunks of sizes n does not divide differ by one element
    total_ok = sum(per_rank) == 2 * (n - 1) * tensor_bytes
    worst = max(per_rank, key=lambda b: abs(b - expected))
    if not total_ok or abs(worst - expected) > slack:
        return Verdict(False, f"{name} (world_size={n}, {tensor_bytes // 8} elements = "
                       f"{tensor_bytes} B): ranks sent {per_rank} B by point-to-point; a "
                       f"ring sends 2(n-1)/n x {tensor_bytes} = {expected:.0f} B per rank. "
                       "Sending whole tensors (or to every rank) moves more; send one 1/n "
                       "chunk per step, 2(n-1) steps in all.")
    if any(m != 2 * (n - 1) for m in messages):
        return Verdict(False, f"{name} (world_size={n}): ranks sent {messages} messages; a "
                       f"ring sends one chunk per step, 2(n-1) = {2 * (n - 1)} messages per "
                       "rank.")
    return Verdict(True, "bytes ok")


def _carries_data(name: str, record: Any, tensors: list[Any], case: int) -> Verdict:
    """Every message carries real data: a slice of a sum of some ranks' tensors.

    In a ring each message is a chunk of partial sums (reduce-scatter) or of the total
    (all-gather); the relay kept what each message carried, so ring-shaped sends of zeros
    or of noise, next to a sum found some other way, earn no credit for their bytes.
    """
    import itertools

    import torch

    from labkit.grading.sandbox.relay_rank import unpack

    n = len(tensors)
    sums = [sum(tensors[s] for s in subset) for k in range(1, n + 1)
            for subset in itertools.combinations(range(n), k)]
    for rank in range(n):
        for payload in record.payloads.get((rank, case), []):
            got = unpack(payload)
            size = got.numel()
            found = got.dtype == torch.float64 and 0 < size <= tensors[0].numel() and any(
                bool((total.unfold(0, size, 1) - got).abs().amax(1).min() <= 1e-9 * n)
                for total in sums)
            if not found:
                return Verdict(False, f"{name} (world_size={n}, rank {rank}): a message of "
                               f"{size} values is not a chunk of a sum of the ranks' tensors. "
                               "Each step of a ring sends a chunk of partial sums (or, in the "
                               "all-gather, of the total), as float64 like the tensor.")
    return Verdict(True, "the messages carry the data")


def check_ring_allreduce(fn: Callable[..., Any], world_sizes: Sequence[int] = (2, 3, 4),
                         sizes: Sequence[int] = RING_SIZES, seed: int = 0) -> Verdict:
    """All ring parts as one Verdict (tests and scripts)."""
    q = ring_question()
    add_ring(q, fn, world_sizes, sizes, seed)
    return q.verdict()


__all__ = ["BUCKET_CAP", "BUCKET_SIZES", "FORBID", "FORBIDDEN_HINT", "add_buckets", "add_ring",
           "add_zero1", "bucket_question", "check_bucketed_sync", "check_ring_allreduce",
           "check_zero1", "expected_buckets", "ring_question", "zero1_question"]
