"""Grade code a student wrote by running it on N real ranks, part by part.

What is graded (problem set 3, "build it", after seeds 002 and 003):

* ``doubling_all_reduce(ctx, tensor)``: sum ``tensor`` across a power-of-two number of
  ranks by **recursive doubling** (Thakur, Rabenseifner and Gropp 2005, "Optimization of
  Collective Communication Operations in MPICH", section 4.4): in step ``k`` = 0, 1, ...
  each rank swaps its whole partial sum with partner ``rank ^ 2^k`` and adds what arrives,
  so after ``log2(n)`` steps every rank holds the total. Cost ``lg p alpha + n lg p beta``:
  ``log2(n)`` messages and ``log2(n) x S`` bytes per rank, against the ring's ``2(n-1)``
  messages and ``2(n-1)/n x S`` bytes (lesson 01): fewer steps, more bytes, which is why
  MPICH uses it for short messages only. Parts: the sums on 2 and on 4 ranks; each rank
  sending ``log2(n)`` messages of the whole tensor to the partners ``rank ^ 2^k``, each
  carrying a partial sum. Gate (fail it, score 0): no collective. Each rank runs in a box
  of its own with no process group, and every message crosses the grader
  (:mod:`labkit.grading.sandbox.relay`), which counts bytes, messages, peers and
  collectives itself: there is no second way between the ranks for a hidden all-reduce.
* ``accumulate_and_sync``: see ``labkit.grading.sync_checks``; ``zero_adam_step``: see
  ``labkit.grading.zero_checks`` (their names are importable from here too);
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
    accumulate_question,
    add_accumulate,
    check_accumulate,
    expected_buckets,
)
from labkit.grading.zero_checks import add_zero_adam, check_zero_adam, zero_adam_question
from labkit.theory.comm import ring_allreduce_steps

DOUBLING_SIZES = (12, 13, 1001)  # divisible, odd, odd and larger
DOUBLING_WORLD_SIZES = (2, 4)
ONLY_P2P = "built from send/recv only"
BYTES = "log2(n) messages of the whole tensor, to partners rank ^ 2^k"


def doubling_steps(world_size: int) -> int:
    """``log2(world_size)``: the steps (and messages per rank) of recursive doubling."""
    if world_size < 1 or world_size & (world_size - 1):
        raise ValueError(f"recursive doubling needs a power-of-two world size, got {world_size}")
    return world_size.bit_length() - 1


def doubling_bytes(world_size: int, tensor_bytes: int) -> int:
    """Bytes one rank sends in a recursive-doubling all-reduce: ``log2(n) x S``."""
    return doubling_steps(world_size) * tensor_bytes


def doubling_partners(rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s partner in each step: ``rank ^ 2^k`` for k = 0 .. log2(n) - 1."""
    return [rank ^ (1 << k) for k in range(doubling_steps(world_size))]


def doubling_question(points: float = 4) -> Question:
    return Question("doubling_all_reduce", points)


def add_doubling(q: Question, fn: Callable[..., Any],
                 world_sizes: Sequence[int] = DOUBLING_WORLD_SIZES,
                 sizes: Sequence[int] = DOUBLING_SIZES, seed: int = 0) -> None:
    """Run the all-reduce on each world size; record the sums and the traffic the grader relayed."""
    name = "doubling_all_reduce"
    for n in world_sizes:
        sums = f"right sums on {n} ranks"
        if stub(q, sums, name):
            continue
        cases = [[inputs(seed, case, r, size) for case, size in enumerate(sizes)]
                 for r in range(n)]
        try:
            out = calls.launch(fn, "allreduce", n, [[cases[r]] for r in range(n)], FORBID)
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
                             f"from the sum over ranks by up to {diff:.3g}. Try: in step k "
                             "(k = 0 .. log2(n) - 1) send your whole partial sum to rank ^ "
                             "2**k, receive theirs into a fresh buffer, then add it.")
            q.record(BYTES, _doubling_traffic(name, record, n, case, size * 8))
            q.record(BYTES, _carries_data(name, record, [cases[r][case] for r in range(n)], case))


def _doubling_traffic(name: str, record: Any, n: int, case: int, tensor_bytes: int) -> Verdict:
    """Bytes, messages and partners of each rank (as the grader relayed them) vs recursive
    doubling's; a ring's traffic (lesson 01) is named as such."""
    steps = doubling_steps(n)
    per_rank = [record.sent_bytes.get((rank, case), 0) for rank in range(n)]
    messages = [record.messages.get((rank, case), 0) for rank in range(n)]
    peers = [sorted(record.peers.get((rank, case), set())) for rank in range(n)]
    expected = doubling_bytes(n, tensor_bytes)
    where = f"{name} (world_size={n}, {tensor_bytes // 8} elements = {tensor_bytes} B)"
    ring = ring_allreduce_steps(n)  # chunks of 1/n each rank sends: 2(n-1) x S in all
    if messages == [ring] * n and sum(per_rank) == ring * tensor_bytes:
        return Verdict(False, f"{where}: each rank sent {messages[0]} messages, "
                       f"{per_rank} B in all: that is lesson 01's ring (2(n-1) chunks of "
                       "1/n). This task is recursive doubling: log2(n) = "
                       f"{steps} exchange(s) of the whole tensor with rank ^ 2**k, so "
                       f"{steps} message(s) and {steps} x {tensor_bytes} = {expected} B per "
                       "rank: fewer steps than the ring, for as many bytes (2 ranks) or more.")
    if per_rank != [expected] * n or messages != [steps] * n:
        return Verdict(False, f"{where}: ranks sent {per_rank} B in {messages} messages by "
                       f"point-to-point; recursive doubling sends log2(n) = {steps} "
                       f"message(s) of the whole tensor per rank, log2(n) x S = {steps} x "
                       f"{tensor_bytes} = {expected} B. Send the partial sum once per step, "
                       "whole, and never to a rank you already heard from.")
    want = [sorted(doubling_partners(rank, n)) for rank in range(n)]
    if peers != want:
        return Verdict(False, f"{where}: the ranks sent to {peers}; in step k a rank swaps "
                       f"with partner rank ^ 2**k, i.e. {want}. Partners chosen so give every "
                       "rank the sum of a block twice as large after each step.")
    return Verdict(True, "traffic ok")


def _carries_data(name: str, record: Any, tensors: list[Any], case: int) -> Verdict:
    """Every message carries real data: a slice of a sum of some ranks' tensors.

    In recursive doubling, step k's message is the sum over the ``2^k`` ranks whose numbers
    differ from the sender's in the low k bits; the relay kept what each message carried,
    so doubling-shaped sends of zeros or of noise, next to a sum found some other way, earn
    no credit for their bytes. (Any slice of a sum of some ranks' tensors passes, so this
    part judges what travels, not the order of the partners.)
    """
    import itertools

    import torch

    from labkit.grading.sandbox.relay_rank import unpack

    n = len(tensors)
    sums = [sum(tensors[s] for s in subset) for k in range(1, n + 1)
            for subset in itertools.combinations(range(n), k)]
    for rank in range(n):
        if record.unkept.get((rank, case)):
            return Verdict(False, f"{name} (world_size={n}, rank {rank}): "
                           f"{record.unkept[(rank, case)]} message(s) came after the relay "
                           "had kept all the contents it keeps, so what they carried cannot "
                           "be checked. Send each step's partial sum once, and nothing else.")
        for payload in record.payloads.get((rank, case), []):
            got = unpack(payload)
            size = got.numel()
            found = got.dtype == torch.float64 and 0 < size <= tensors[0].numel() and any(
                bool((total.unfold(0, size, 1) - got).abs().amax(1).min() <= 1e-9 * n)
                for total in sums)
            if not found:
                return Verdict(False, f"{name} (world_size={n}, rank {rank}): a message of "
                               f"{size} values is not a chunk of a sum of the ranks' tensors. "
                               "Each step of recursive doubling sends your partial sum so "
                               "far (the whole tensor, float64 like the tensor).")
    return Verdict(True, "the messages carry the data")


def check_doubling_allreduce(fn: Callable[..., Any],
                             world_sizes: Sequence[int] = DOUBLING_WORLD_SIZES,
                             sizes: Sequence[int] = DOUBLING_SIZES, seed: int = 0) -> Verdict:
    """All recursive-doubling parts as one Verdict (tests and scripts)."""
    q = doubling_question()
    add_doubling(q, fn, world_sizes, sizes, seed)
    return q.verdict()


__all__ = ["BUCKET_CAP", "BUCKET_SIZES", "DOUBLING_SIZES", "DOUBLING_WORLD_SIZES", "FORBID",
           "FORBIDDEN_HINT", "accumulate_question", "add_accumulate", "add_doubling",
           "add_zero_adam", "check_accumulate", "check_doubling_allreduce", "check_zero_adam",
           "doubling_bytes", "doubling_partners", "doubling_question", "doubling_steps",
           "expected_buckets", "zero_adam_question"]
