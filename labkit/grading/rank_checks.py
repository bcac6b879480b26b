"""Shared pieces of the real-rank code checks: inputs, stubs, failures, gates, comparisons.

``code_checks`` (recursive doubling), ``sync_checks`` (accumulation with ``no_sync``) and
``zero_checks`` (ZeRO-1 with Adam) record into partial-credit
:class:`~labkit.grading.parts.Question` objects through these: the grader draws every rank's
inputs here (``inputs``) and hands each rank only its own, a stub found once is not
launched again, a failing rank becomes feedback, a gate part forbids collectives (the
grader relays every message, so it saw each one) or calls into labkit's implementations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from labkit.grading.parts import Question

if TYPE_CHECKING:
    import torch

    from labkit.grading.sandbox.relay import Record

FORBID = ("labkit.strategies", "labkit.grading")

STUB = "{name} is not implemented yet: replace `raise NotImplementedError` with your code."
NO_GROUP = ("Default process group", "init_process_group", "distributed package")


def inputs(seed: int, case: int, rank: int, size: int, dtype: torch.dtype | None = None
           ) -> torch.Tensor:
    """Rank ``rank``'s input for case ``case``: drawn by the grader, sent to that rank only."""
    import torch

    g = torch.Generator().manual_seed(seed * 100_003 + case * 1009 + rank)
    return torch.randn(size, generator=g, dtype=dtype or torch.float64)


def stub(q: Question, label: str, name: str) -> bool:
    """Skip starting ranks when an earlier run of this question settled it already.

    A stub (``NotImplementedError``) is recorded again on ``label``; after a failed gate
    the question scores 0 whatever happens next, so nothing more is run or recorded.
    """
    if getattr(q, "stub", False):
        q.record(label, False, STUB.format(name=name))
        return True
    return any(p.gate and p.ran and not p.passed for p in q.parts.values())


def failure(q: Question, label: str, name: str, exc: Exception) -> None:
    text = str(exc)
    if isinstance(exc, NotImplementedError) or "NotImplementedError" in text:
        q.record(label, False, STUB.format(name=name))
        q.stub = True  # type: ignore[attr-defined]  # later checks need not start ranks
        return
    hint = ("Try: run it yourself with labkit.launch(your_function, 2, ...) and read the "
            "traceback; a hang usually means a send without a matching recv.")
    if any(word in text for word in NO_GROUP):
        hint = ("The ranks of this exercise have no process group: they talk only through "
                "ctx.comm, whose every message the grader carries and counts.")
    q.record(label, False, f"{name} failed on real ranks: {text.strip()[-1200:]}\n{hint}")


def gate(q: Question, name: str, records: Sequence[dict[str, Any]], record: Record,
         label: str, allowed: tuple[str, ...] | None = ()) -> bool:
    """A gate part: no call into labkit's implementation, no collective outside ``allowed``.

    ``records`` are the ranks' own reports (calls into forbidden modules, for practice
    runs); ``record`` is what the grader relayed, where every collective shows.
    ``allowed=None`` allows every collective (ZeRO-1 is made of them).
    """
    for rec in records:
        if rec.get("tampered") or rec.get("used"):
            return q.forbidden(label, rec.get("used", []), bool(rec.get("tampered")), gate=True)
    used = sorted({k for kinds in record.collectives.values() for k in kinds})
    bad = [c for c in used if allowed is not None and c not in allowed]
    if bad:
        return q.record(label, False, f"{name} used built-in collective(s) {bad} (every "
                        "message went through the grader, which saw them). The task allows "
                        f"{', '.join(allowed or ()) or 'no collective'}.", gate=True)
    return q.record(label, True, gate=True)


def compare(values: dict[str, Any], want: Any) -> float | str:
    """Max abs difference of a returned result and the expected tensor, or an error."""
    if "error" in values:
        return str(values["error"])
    flat = want.double().reshape(-1).tolist()
    got = values.get("values", [])
    if len(got) != len(flat):
        return f"has {len(got)} values, expected {len(flat)}"
    return float(max((abs(a - b) for a, b in zip(got, flat)), default=0.0))
