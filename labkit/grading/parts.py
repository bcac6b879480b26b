"""Partial credit: a question is several parts, each scored on its own, with feedback.

A :class:`Question` has ``points`` and named parts (e.g. "ZeRO-0", "ZeRO-1 and 2",
"ZeRO-3"). Checks add cases to parts; a part passes when every case it got passed.
``score()`` prints one line per part (passed, or what failed and what to try) and
returns the points earned: ``points x (weight of passed parts) / (weight of parts
declared)``; a part no check reached yet counts as not earned. nbgrader reads that number
as the test cell's partial credit (its ``execute_result``), so the last line of a test
cell is ``q.score()``.

A *gate* part is a condition for all the others: failing it scores the whole question 0
(e.g. "built from send/recv only" for the ring all-reduce: the right sums from a built-in
all-reduce are not the student's work). Parts a check never reached (the hidden tests, in
the student's own notebook) are listed as "checked at grading".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from labkit.grading.checks import Verdict

FORBIDDEN_HINT = ("it calls {used}, which computes the answer for you. This exercise asks "
                  "you to do that work yourself: write the formula (or the plan) in your "
                  "function, without calling labkit.")


@dataclass
class Part:
    """One scored part of a question."""

    label: str
    weight: float = 1.0
    gate: bool = False
    cases: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ran(self) -> bool:
        return self.cases > 0

    @property
    def passed(self) -> bool:
        return self.ran and not self.failures


class Question:
    """A question worth ``points``, scored part by part."""

    def __init__(self, name: str, points: float, parts: Iterable[str | tuple[str, float]] = ()):
        self.name, self.points = name, float(points)
        self.parts: dict[str, Part] = {}
        for p in parts:
            label, weight = (p, 1.0) if isinstance(p, str) else p
            self.parts[label] = Part(label, weight)

    def part(self, label: str, *, gate: bool = False, weight: float = 1.0) -> Part:
        if label not in self.parts:
            self.parts[label] = Part(label, weight, gate)
        self.parts[label].gate = self.parts[label].gate or gate
        return self.parts[label]

    def record(self, label: str, verdict: Verdict | bool, feedback: str = "", *,
               gate: bool = False) -> bool:
        """Add one case to part ``label``; keep the first few failures' feedback."""
        part = self.part(label, gate=gate)
        part.cases += 1
        passed = verdict.passed if isinstance(verdict, Verdict) else bool(verdict)
        if not passed:
            text = verdict.feedback if isinstance(verdict, Verdict) else feedback
            if len(part.failures) < 2 and text not in part.failures:
                part.failures.append(text)
        return passed

    def forbidden(self, label: str, used: list[str], tampered: bool = False, *,
                  gate: bool = False) -> bool:
        """Record a case that failed because the answer called labkit's own key."""
        if tampered:
            return self.record(label, False, "the grader's call tracer was switched off "
                               "inside your function, so this part cannot be credited.",
                               gate=gate)
        return self.record(label, False, FORBIDDEN_HINT.format(used=", ".join(used[:3])),
                           gate=gate)

    @property
    def ran(self) -> list[Part]:
        return [p for p in self.parts.values() if p.ran]

    @property
    def earned(self) -> float:
        """Points for the passed parts; parts that never ran (hidden ones, checked at
        grading) count as not earned yet; a failed gate earns nothing."""
        ran = self.ran
        if not ran or any(p.gate and not p.passed for p in ran):
            return 0.0
        scored = [p for p in self.parts.values() if not p.gate]
        if not scored:
            return self.points
        total = sum(p.weight for p in scored) or 1.0
        return round(self.points * sum(p.weight for p in scored if p.passed) / total, 3)

    @property
    def passed(self) -> bool:
        return bool(self.ran) and all(p.passed for p in self.ran)

    def feedback(self) -> str:
        lines = [f"{self.name}: {self.earned:g} / {self.points:g} points"]
        for p in self.parts.values():
            if not p.ran:
                lines.append(f"  [checked at grading] {p.label}")
            elif p.passed:
                lines.append(f"  [ok] {p.label}")
            else:
                lines.append(f"  [failed] {p.label}: " + " | ".join(p.failures))
        if any(p.gate and not p.passed for p in self.ran):
            lines.append("  A required part failed, so the other parts earn nothing yet.")
        return "\n".join(lines)

    def verdict(self) -> Verdict:
        return Verdict(self.passed, self.feedback())

    def score(self) -> float:
        """Print the per-part feedback and return the points earned (nbgrader's partial credit)."""
        print(self.feedback())
        return float(self.earned)
