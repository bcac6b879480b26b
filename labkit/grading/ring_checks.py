"""Grade problem set 8 (long sequences): the online-softmax merge, then one ring-attention step
on real ranks.

* ``merge_partials(out1, lse1, out2, lse2)``: two partial attention results over disjoint key
  sets -> the result over their union (Milakov & Gimelshein 2018; flash attention, Dao et al.
  2022): ``lse = log(e^lse1 + e^lse2)``, ``out = e^(lse1-lse) out1 + e^(lse2-lse) out2``.
  Parts: the output, the log-sum-exp, and a query that saw no key in one part (or in both:
  ``(0, -inf)``, never NaN). labkit's own merge is not the student's work: calling into
  ``labkit.train`` is refused.
* ``ring_attention_step(ctx, q, k, v, out, lse)``: one step of ring attention (Liu et al.
  2023): send the key/value block held to rank r+1, receive rank r-1's, attend this rank's
  queries to it and merge into the running ``(out, lse)``; return ``(out, lse, k, v)`` with
  the block received. The harness (``rank_side.ring_step_rank``) starts every rank on its own
  block and calls the step ``n - 1`` times; after them each rank's output must equal one
  process's softmax attention of its queries over every rank's keys. Parts: that equality on
  2 and 3 ranks (hidden: the student's own sizes and world sizes); the traffic, as the grader
  relayed it: each step one K and one V block (or both stacked) to rank r+1 only, carrying a
  real block of some rank. Gate: no collective. Each rank is a box of its own and every
  message crosses the grader (as in problem set 3), so there is no hidden way between ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labkit.grading import calls
from labkit.grading.checks import Verdict
from labkit.grading.parts import Question
from labkit.grading.rank_checks import compare, failure, gate, inputs, stub

FORBID_MERGE = ("labkit.train", "labkit.strategies", "labkit.grading")
MERGE_SHAPE = (2, 3, 5, 4)  # (batch, heads, queries, head_dim)
RING_WORLD_SIZES = (2, 3)
RING_SHAPE = (1, 2, 4, 8)  # one rank's block: (batch, heads, tokens, head_dim)
ONLY_P2P = "built from send/recv only"
TRAFFIC = "each step: one K/V block to rank r+1, carrying a real block"


def _merge_cases(seed: int, shape: Sequence[int]) -> list[tuple[Any, ...]]:
    """(out1, lse1, out2, lse2) cases: plain; part 2 empty for some queries; both empty for one."""
    b, h, t, d = shape
    cases = []
    for case in range(3):
        out1, out2 = (inputs(seed, case, r, b * h * t * d).view(b, h, t, d) for r in (0, 1))
        lse1, lse2 = (3 * inputs(seed, case, r, b * h * t).view(b, h, t) for r in (2, 3))
        if case >= 1:  # queries 0 (and in case 2 query 1) saw no key in part 2
            lse2[..., 0], out2[..., 0, :] = float("-inf"), 0.0
        if case == 2:
            for lse, out in ((lse1, out1), (lse2, out2)):
                lse[..., 1], out[..., 1, :] = float("-inf"), 0.0
        cases.append((out1, lse1, out2, lse2))
    return cases


def expected_merge(out1: Any, lse1: Any, out2: Any, lse2: Any) -> tuple[Any, Any]:
    """The merge, as the grader computes it (a query with no key anywhere: 0 and -inf)."""
    import torch

    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w1, w2 = torch.exp(lse1 - safe), torch.exp(lse2 - safe)
    return w1.unsqueeze(-1) * out1 + w2.unsqueeze(-1) * out2, lse


def merge_question(points: float = 3) -> Question:
    return Question("merge_partials", points)


def _pair(value: Any) -> Any:
    import torch

    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(
            isinstance(v, torch.Tensor) for v in value):
        return "must return a pair (out, lse) of tensors"
    return value


def add_merge(q: Question, fn: Callable[..., Any], seed: int = 0,
              shape: Sequence[int] = MERGE_SHAPE) -> None:
    """Merge each case with the student's function; record output, lse and the empty rows."""
    import torch

    for case, args in enumerate(_merge_cases(seed, shape)):
        where = f"merge_partials(case {case}, shape {tuple(shape)})"
        got = calls.answer(q, "the merged output", fn, args, forbid=FORBID_MERGE,
                           reader=_pair, where=where,
                           hint="compute lse = log(e^lse1 + e^lse2) without overflow "
                           "(torch.logaddexp), then weight each output by e^(lse_i - lse)")
        if got is None:
            return
        out, lse = (torch.as_tensor(v).double() for v in got)
        want_out, want_lse = expected_merge(*args)
        if out.shape != want_out.shape or lse.shape != want_lse.shape:
            q.record("the merged output", False, f"{where}: shapes {tuple(out.shape)} and "
                     f"{tuple(lse.shape)}; expected {tuple(want_out.shape)} and "
                     f"{tuple(want_lse.shape)}")
            return
        finite = ~torch.isinf(want_lse)
        rows = (slice(None), slice(None), slice(2 if case else 0, None))
        ok_out = bool(torch.allclose(out[rows], want_out[rows], atol=1e-9, rtol=0))
        q.record("the merged output", ok_out, f"{where}: the output differs by up to "
                 f"{(out[rows] - want_out[rows]).abs().max():.3g}. Each part's output is "
                 "normalised over its own keys: weight it by its share of all the softmax "
                 "mass, e^(lse_i - lse).")
        ok_lse = bool(torch.equal(torch.isinf(lse), ~finite)) and bool(
            torch.allclose(lse[finite], want_lse[finite], atol=1e-9, rtol=0))
        q.record("the log-sum-exp", ok_lse, f"{where}: lse should be log(e^lse1 + e^lse2) "
                 "for every query.")
        if case:
            empty = (slice(None), slice(None), slice(0, 2))
            ok = not bool(torch.isnan(out).any() or torch.isnan(lse).any()) and bool(
                torch.allclose(out[empty], want_out[empty], atol=1e-9, rtol=0))
            q.record("queries that saw no key in a part", ok, f"{where}: a part with lse = "
                     "-inf brings nothing (its weight is 0), and a query that saw no key in "
                     "either part stays (0, -inf): guard the subtraction -inf - (-inf) = NaN.")


def ring_step_question(points: float = 4) -> Question:
    return Question("ring_attention_step", points)


def add_ring_step(q: Question, fn: Callable[..., Any],
                  world_sizes: Sequence[int] = RING_WORLD_SIZES,
                  shape: Sequence[int] = RING_SHAPE, seed: int = 0) -> None:
    """Run ``n - 1`` ring steps on each world size; the outputs against one process, and the
    traffic the grader relayed."""
    import torch

    name = "ring_attention_step"
    size = int(torch.tensor(shape).prod())
    for n in world_sizes:
        label = f"equals one process on {n} ranks"
        if stub(q, label, name):
            continue
        blocks = [[inputs(seed, part, r, size).view(*shape) for part in range(3)]
                  for r in range(n)]
        try:
            out = calls.launch(fn, "ring_step", n, [blocks[r] for r in range(n)],
                               FORBID_MERGE)
        except Exception as exc:  # noqa: BLE001 (any failure of student code is feedback)
            failure(q, label, name, exc)
            continue
        results, record = out["results"], out["record"]
        if not gate(q, name, [rec for r in results for rec in r["records"]], record, ONLY_P2P):
            return
        keys = torch.cat([b[1] for b in blocks], dim=-2)
        values = torch.cat([b[2] for b in blocks], dim=-2)
        for rank in range(n):
            q_r = blocks[rank][0]
            want = torch.softmax(q_r @ keys.transpose(-2, -1) * shape[-1] ** -0.5, -1) @ values
            diff = compare(results[rank], want)
            where = f"{name} (world_size={n}, rank {rank}, blocks {tuple(shape)})"
            if isinstance(diff, str):
                q.record(label, False, f"{where}: the output {diff}. Return (out, lse, k, v).")
            else:
                q.record(label, diff <= 1e-9, f"{where}: after {n - 1} steps the output differs "
                         f"from attention over every rank's keys by up to {diff:.3g}. Attend "
                         "to the block you RECEIVED and merge it into the running result.")
        q.record(TRAFFIC, _ring_traffic(name, record, blocks, n))


def _ring_traffic(name: str, record: Any, blocks: list[list[Any]], n: int) -> Verdict:
    from labkit.grading.sandbox.relay_rank import unpack

    block_bytes = blocks[0][1].numel() * 8
    real = [b[part] for b in blocks for part in (1, 2)]
    for step in range(n - 1):
        for rank in range(n):
            where = f"{name} (world_size={n}, rank {rank}, ring step {step})"
            sent = record.sent_bytes.get((rank, step), 0)
            peers = sorted(record.peers.get((rank, step), set()))
            if sent != 2 * block_bytes or peers != [(rank + 1) % n]:
                return Verdict(False, f"{where}: sent {sent} B to {peers}; a ring step sends "
                               f"the K and V block held ({2 * block_bytes} B in all) to rank "
                               f"(rank + 1) % n = {(rank + 1) % n} only.")
            for payload in record.payloads.get((rank, step), []):
                got = unpack(payload).double().reshape(-1)
                if not any(_holds(got, t.reshape(-1)) for t in real):
                    return Verdict(False, f"{where}: a message of {got.numel()} values is not "
                                   "a K or V block of any rank: pass on the block you hold.")
    return Verdict(True, "ring traffic ok")


def _holds(got: Any, block: Any) -> bool:
    """``got`` is ``block``, or ``block`` stacked with another (K and V sent together)."""
    size = block.numel()
    if got.numel() not in (size, 2 * size):
        return False
    return any(bool((got[i:i + size] - block).abs().max() <= 1e-12)
               for i in range(0, got.numel(), size))
