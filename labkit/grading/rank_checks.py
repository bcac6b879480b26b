"""Shared pieces of the real-rank code checks: stubs, failures, gates, comparisons.

``code_checks`` (the ring all-reduce) and ``sync_checks`` (bucketed gradient sync, ZeRO-1)
record into partial-credit :class:`~labkit.grading.parts.Question` objects through these:
a stub found once is not launched again, a failing rank becomes feedback, a gate part
forbids collectives (counted at the c10d level) or calls into labkit's implementations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.analysis.timeline import Timeline
from labkit.base.events import Lane, Op
from labkit.grading.parts import Question

FORBID = ("labkit.strategies", "labkit.grading")

STUB = "{name} is not implemented yet: replace `raise NotImplementedError` with your code."


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
    q.record(label, False, f"{name} failed on real ranks: {text.strip()[-1200:]}\nTry: run "
             "it yourself with labkit.launch(your_function, 2, ...) and read the traceback; "
             "a hang usually means a send without a matching recv.")


def window(timeline: Timeline, rank: int, step: int) -> list[Any]:
    """The comm events of ``rank`` inside its STEP span number ``step`` (the student's)."""
    spans = [e for e in timeline.select(rank=rank, op=Op.STEP) if e.step == step]
    if not spans:
        return []
    s = spans[0]
    return [e for e in timeline.select(rank=rank, lane=Lane.COMM)
            if s.start_ns <= e.start_ns <= s.end_ns]


def gate(q: Question, name: str, records: Sequence[dict[str, Any]], label: str,
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


def compare(values: dict[str, Any], want: Any, seed: int) -> float | str:
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
