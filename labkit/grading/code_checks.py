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
* ``bucketed_allreduce(ctx, grads, cap_bytes)``: average a list of gradients with one
  all-reduce per bucket (greedy in list order; a bucket closes before it would exceed
  ``cap_bytes``; a gradient larger than the cap travels alone), as PyTorch DDP does.
* ``zero1_step(ctx, param, grad, state, lr, momentum)``: ZeRO stage 1 (Rajbhandari et al.
  2020) for momentum SGD on a flat parameter: each rank keeps optimizer state for its own
  1/n shard only, updates that shard with the mean gradient, and all-gathers the result.
* a 1F1B plan: see ``labkit.grading.plan_code``.

The student's function runs on real ranks (in the grading box during autograding); only
plain numbers come back, and the expected values are computed here from the inputs'
seed. ``check_*`` functions return a ``Verdict`` (all parts passed or not, with the
per-part feedback); ``*_question`` + ``add_*`` build the partial-credit questions the
notebooks use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from labkit.events import Lane, Op
from labkit.grading import calls
from labkit.grading.checks import Verdict
from labkit.grading.parts import FORBIDDEN_HINT, Question
from labkit.timeline import Timeline

RING_SIZES = (12, 13, 1001)  # divisible, odd, odd and larger
WIRE_SIZE = 1 << 18  # float64 elements: 2 MB, so the loopback count is mostly payload
FORBID = ("labkit.strategies", "labkit.grading")
ONLY_P2P = "built from send/recv only"


def _failure(q: Question, label: str, name: str, exc: Exception) -> None:
    text = str(exc)
    if isinstance(exc, NotImplementedError) or "NotImplementedError" in text:
        q.record(label, False, f"{name} is not implemented yet: replace `raise "
                 "NotImplementedError` with your code.")
        return
    q.record(label, False, f"{name} failed on real ranks: {text.strip()[-1200:]}\nTry: run "
             "it yourself with labkit.launch(your_function, 2, ...) and read the traceback; "
             "a hang usually means a send without a matching recv.")


def _window(timeline: Timeline, rank: int, step: int) -> list[Any]:
    """The comm events of ``rank`` inside its STEP span number ``step`` (the student's)."""
    spans = [e for e in timeline.select(rank=rank, op=Op.STEP) if e.step == step]
    if not spans:
        return []
    s = spans[0]
    return [e for e in timeline.select(rank=rank, lane=Lane.COMM)
            if s.start_ns <= e.start_ns <= s.end_ns]


def _gate(q: Question, name: str, records: Sequence[dict[str, Any]], label: str,
          allowed: tuple[str, ...] | None = ()) -> bool:
    """A gate part: no call into labkit's implementation, no collective outside ``allowed``.

    ``allowed=None`` allows every collective (ZeRO-1 is made of them).
    """
    for rec in records:
        if rec.get("tampered") or rec.get("used"):
            return q.forbidden(label, rec.get("used", []), bool(rec.get("tampered")), gate=True)
        bad = [c for c in rec.get("collectives", []) if allowed is not None and c not in allowed]
        if bad:
            names = sorted({c.removeprefix("c10d.").rstrip("_") for c in bad})
            return q.record(label, False, f"{name} used built-in collective(s) {names} (seen "
                            "at the process-group level, whichever way they were called). "
                            f"The task allows {', '.join(allowed or ()) or 'no collective'}.",
                            gate=True)
    return q.record(label, True, gate=True)


def _compare(values: dict[str, Any], want: Any, seed: int) -> float | str:
    """Max abs difference of a returned result and the expected tensor, or an error."""
    from labkit.grading.rank_side import sample_indices

    if "error" in values:
        return str(values["error"])
    flat = want.double().reshape(-1)
    if "values" in values:
        return float(max((abs(a - b) for a, b in zip(values["values"], flat.tolist())),
                         default=0.0))
    picked = flat[sample_indices(seed, flat.numel())].tolist()
    worst = max(abs(a - b) for a, b in zip(values["sample"], picked))
    return max(worst, abs(values["sum"] - float(flat.sum())) / max(1, flat.numel()) ** 0.5)


# --- ring all-reduce --------------------------------------------------------------------------

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
        try:
            out = calls.launch(fn, "ring", n, [all_sizes, seed], FORBID)
        except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
            _failure(q, sums, name, exc)
            continue
        results, timeline = out["results"], out["timeline"]
        if not _gate(q, name, [rec for rank in results for rec in rank], ONLY_P2P):
            return
        for case, size in enumerate(all_sizes):
            want = sum(inputs(seed, case, r, size) for r in range(n))
            for rank in range(n):
                diff = _compare(results[rank][case], want, seed + case)
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
        sends = [e for e in _window(timeline, rank, case) if e.op == Op.SEND]
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


# --- bucketed gradient sync -------------------------------------------------------------------

BUCKET_SIZES = (1000, 10, 300, 5000, 7, 2000, 600)  # float32 elements
BUCKET_CAP = 8000  # bytes


def expected_buckets(sizes_bytes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """Greedy buckets in list order (indices); close a bucket before it would exceed the cap."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, b in enumerate(sizes_bytes):
        if current and filled + b > cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += b
    if current:
        buckets.append(current)
    return buckets


def bucket_question(points: float = 3) -> Question:
    return Question("bucketed_allreduce", points, ["averages match", "one all-reduce per bucket"])


def add_buckets(q: Question, fn: Callable[..., Any], world_size: int = 2,
                sizes: Sequence[int] = BUCKET_SIZES, cap_bytes: int = BUCKET_CAP,
                seed: int = 0) -> None:
    """Averages right; one traced all-reduce per greedy bucket, every byte reduced once."""
    import torch

    from labkit.grading.rank_side import inputs

    name = "bucketed_allreduce"
    try:
        out = calls.launch(fn, "bucket", world_size, [list(sizes), cap_bytes, seed], FORBID)
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        _failure(q, "averages match", name, exc)
        return
    results, timeline = out["results"], out["timeline"]
    if not _gate(q, name, results, "your own bucketing, with ctx.comm.all_reduce",
                 allowed=("c10d.allreduce_",)):
        return
    want = expected_buckets([4 * s for s in sizes], cap_bytes)
    for rank, rec in enumerate(results):
        for i, (got, n) in enumerate(zip(rec["grads"], sizes)):
            mean = sum(inputs(seed, i, r, n, torch.float32) for r in range(world_size)) / world_size
            diff = _compare(got, mean, seed + i)
            q.record("averages match", not isinstance(diff, str) and diff <= 1e-5,
                     f"{name} (rank {rank}) grads[{i}]: " + (diff if isinstance(diff, str) else
                     f"off the mean over ranks by {diff:.3g}") + ". Try: flatten a bucket "
                     "with torch.cat, all-reduce it, divide by world_size, and copy each "
                     "slice back in place (view_as the original gradient).")
        reduces = [e for e in _window(timeline, rank, 0) if e.op == Op.ALL_REDUCE]
        untraced = rec["ops"].get("c10d.allreduce_", 0) - len(reduces)
        ok = untraced <= 0 and len(reduces) == len(want) and \
            sum(e.bytes or 0 for e in reduces) == 4 * sum(sizes)
        q.record("one all-reduce per bucket", ok,
                 f"{name} (rank {rank}): {len(reduces)} traced all-reduce(s) of "
                 f"{sorted(e.bytes or 0 for e in reduces)} B and {max(untraced, 0)} untraced; "
                 f"with a {cap_bytes} B cap the gradients {list(sizes)} (float32) form "
                 f"{len(want)} buckets {want}. Use ctx.comm.all_reduce, fill buckets in list "
                 "order and close one before it would exceed the cap.")


def check_bucketed_sync(fn: Callable[..., Any], world_size: int = 2,
                        sizes: Sequence[int] = BUCKET_SIZES, cap_bytes: int = BUCKET_CAP,
                        seed: int = 0) -> Verdict:
    q = bucket_question()
    add_buckets(q, fn, world_size, sizes, cap_bytes, seed)
    return q.verdict()


# --- ZeRO-1 ---------------------------------------------------------------------------------

def zero1_question(points: float = 3) -> Question:
    return Question("zero1_step", points, ["parameters match momentum SGD",
                                           "optimizer state sharded 1/n"])


def add_zero1(q: Question, fn: Callable[..., Any], world_size: int = 2, size: int = 24,
              steps: int = 3, lr: float = 0.1, momentum: float = 0.9, seed: int = 0) -> None:
    """Same parameters as single-process momentum SGD; optimizer state sharded 1/n."""
    import torch

    from labkit.grading.rank_side import inputs

    name = "zero1_step"
    size = world_size * math.ceil(size / world_size)
    try:
        out = calls.launch(fn, "zero1", world_size, [size, steps, lr, momentum, seed], FORBID)
    except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
        _failure(q, "parameters match momentum SGD", name, exc)
        return
    if not _gate(q, name, out["results"], "your own sharding", allowed=None):
        return
    ref, buf = inputs(seed, 999, 0, size), torch.zeros(size, dtype=torch.float64)
    for step in range(steps):  # the single-process reference: momentum SGD on the mean grad
        buf = momentum * buf + torch.stack([inputs(seed, step, r, size)
                                            for r in range(world_size)]).mean(0)
        ref = ref - lr * buf
    for rank, rec in enumerate(out["results"]):
        where = f"world_size={world_size}, rank {rank}"
        diff = _compare(rec["param"], ref, seed)
        q.record("parameters match momentum SGD", not isinstance(diff, str) and diff <= 1e-9,
                 f"{name} ({where}): after {steps} steps the parameters " +
                 (diff if isinstance(diff, str) else f"differ from plain momentum SGD on the "
                  f"mean gradient by up to {diff:.3g}") + ". Try: average the gradients "
                 "(reduce-scatter, or all-reduce / world_size), update only your shard "
                 "param.chunk(world_size)[rank], then all-gather the shards into param.")
        shard = size // world_size
        q.record("optimizer state sharded 1/n", rec["state_values"] == shard,
                 f"{name} ({where}): the optimizer state holds {rec['state_values']} values; "
                 f"ZeRO-1 keeps only this rank's shard of the momentum, {size} / {world_size} "
                 f"= {shard} values. Store one momentum tensor of the shard's size in `state`.")


def check_zero1(fn: Callable[..., Any], world_size: int = 2, size: int = 24, steps: int = 3,
                lr: float = 0.1, momentum: float = 0.9, seed: int = 0) -> Verdict:
    q = zero1_question()
    add_zero1(q, fn, world_size, size, steps, lr, momentum, seed)
    return q.verdict()


__all__ = ["FORBIDDEN_HINT", "add_buckets", "add_ring", "add_zero1", "bucket_question",
           "check_bucketed_sync", "check_ring_allreduce", "check_zero1", "expected_buckets",
           "ring_question", "zero1_question"]
