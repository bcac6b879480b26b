"""The self-test's result: one ``Row`` per check, and the table an instructor pastes.

A row names the lesson whose point it proves, what was measured, the bar it had to meet,
how far the measurement is from what the lesson predicts (``off_by``), and a verdict:
``pass``, ``FAIL`` (with why) or ``skipped`` (with why: no GPU, too few GPUs, no
``nvidia-smi``). ``SelftestReport`` prints the rows as a fixed-width text table, a Markdown
table (``--markdown``) or JSON (``--json``, the same keys as ``Row`` plus the machine).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skipped"


@dataclass
class Row:
    """One check of one lesson's point on this machine."""

    key: str
    """Stable id for scripts, e.g. ``zero_2_bytes``."""
    lesson: str
    """The lesson number whose point this row proves, e.g. ``05``."""
    check: str
    """What is checked, in words."""
    backend: str
    """Where it ran: gloo, nccl, cuda (one GPU, no process group), host (no ranks)."""
    status: str
    """pass, fail or skipped."""
    measured: str = ""
    expected: str = ""
    """The bar the measurement had to meet, with its unit."""
    off_by: str = ""
    """Measured minus predicted (or the ratio to it), whatever the verdict."""
    note: str = ""
    """What it means, why it failed, or why it was skipped."""
    values: dict[str, Any] = field(default_factory=dict)
    """The raw numbers behind the row (JSON only)."""
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        if self.status == PASS:
            return "pass"
        if self.status == SKIP:
            return f"skipped: {self.note}"
        return "FAIL" + (f": {self.note}" if self.note else "")


def skipped(key: str, lesson: str, check: str, backend: str, why: str) -> Row:
    return Row(key=key, lesson=lesson, check=check, backend=backend, status=SKIP, note=why)


@dataclass
class SelftestReport:
    """Every row, and the machine they were measured on."""

    rows: list[Row]
    machine: dict[str, Any]
    """Platform, cores, GPUs, the backend the rank rows used, load average before / after."""
    wall_s: float = 0.0

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)

    @property
    def ok(self) -> bool:
        """No row failed (skipped rows are not failures: they say why)."""
        return self.count(FAIL) == 0

    def summary(self) -> str:
        return (f"{self.count(PASS)} passed, {self.count(FAIL)} failed, {self.count(SKIP)} "
                f"skipped in {self.wall_s:.0f} s")

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": {s: self.count(s) for s in (PASS, FAIL, SKIP)},
                "wall_s": self.wall_s, "machine": self.machine,
                "rows": [{**asdict(r), "verdict": r.verdict} for r in self.rows]}

    def _header(self) -> str:
        m = self.machine
        gpus = ", ".join(g["name"] for g in m.get("gpus", [])) or "none"
        return (f"labkit doctor --selftest: {m.get('platform', '?')}; {m.get('cpu_cores')} cores; "
                f"GPUs: {gpus}; ranks on {m.get('backend')} x {m.get('world_size')}; load "
                f"average {m.get('load_before', 0):.2f} before, {m.get('load_after', 0):.2f} after")

    def markdown(self) -> str:
        """A Markdown table (a ticket, docs/benchmarks.md)."""
        lines = [self._header(), "",
                 "| lesson | check | backend | measured | expected | off by | result |",
                 "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            result = "pass" if r.status == PASS else f"**{r.verdict}**" if r.status == FAIL \
                else r.verdict
            note = f" ({r.note})" if r.status == PASS and r.note else ""
            lines.append(f"| {r.lesson} | {_md(r.check)} | {r.backend} | {_md(r.measured)} | "
                         f"{_md(r.expected)} | {_md(r.off_by)} | {_md(result + note)} |")
        lines += ["", self.summary()]
        return "\n".join(lines)

    def __str__(self) -> str:
        cols = ("lesson", "check", "backend", "measured", "expected", "off by", "result")
        body = [(r.lesson, r.check, r.backend, r.measured, r.expected, r.off_by,
                 "pass" if r.status == PASS else "FAIL" if r.status == FAIL else "skipped")
                for r in self.rows]
        widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c)
                  for i, c in enumerate(cols)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [self._header(), "", fmt.format(*cols), fmt.format(*("-" * w for w in widths))]
        for r, b in zip(self.rows, body):
            lines.append(fmt.format(*b))
            if r.note:
                lines.append(" " * (widths[0] + 2) + f"^ {r.note}")
        lines += ["", self.summary()]
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def _md(text: str) -> str:
    return text.replace("|", "\\|")
