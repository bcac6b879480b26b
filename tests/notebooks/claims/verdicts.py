"""How a lesson's timed claims are held (issue 32): ``timed`` for a margin, ``judged`` for the
verdicts a lesson printed. Counted claims never come here: load excuses none."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from labkit.lessons.machine import NOT_DEDICATED, Load, load_now

SAID = NOT_DEDICATED
"""The end of ``why_not``'s sentence: the lesson told the student its run missed the rule."""


DURING: list[float] = []
"""Cores' worth of other programs' CPU over the lesson's whole run, when the harness read it
(``claims.check``'s ``others``)."""
READ: list[Load] = []
"""How busy the machine was, read once per check (``machine_load``)."""
QUIET_MISSES: list[str] = []
"""Timed claims that missed on a quiet machine: ``claims.check`` fails with all of them."""
LESSON: list[str] = []
"""The lesson being checked (``claims.check`` sets it), for ``LOG_ENV``'s rows."""
LOG_ENV = "LABKIT_VERDICT_LOG"
"""A file each judged verdict is appended to, one JSON row each (``log_verdicts``), where the
variable is set: two runs beside the same load must say the same words
(``tests.notebooks.claims.flips``; the suite sets it under ``LABKIT_TEST_HOGS``)."""


def log_verdicts(verdicts: Sequence[Any]) -> None:
    """Append each verdict -- the lesson, what it judged, its word, its numbers and how busy
    the machine was -- to the file named by ``LOG_ENV`` (nothing where it is unset)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    load = machine_load()
    with open(path, "a", encoding="utf-8") as out:
        for v in verdicts:
            out.write(json.dumps({
                "lesson": LESSON[0] if LESSON else "", "what": v.what, "word": v.word,
                "value": v.sample.value, "noise": v.sample.noise, "lo": v.claim.lo,
                "hi": v.claim.hi, "busy": load.busy, "load": load.text()}) + "\n")


def machine_load() -> Load:
    """The busier of two readings (other programs' CPU while the lesson ran, and now), read
    once per check."""
    if not READ:
        now = load_now(fresh=True)
        readings = [now] + [Load(now.load, now.cores, others) for others in DURING]
        READ.append(next((r for r in readings if r.busy), readings[-1]))
    return READ[0]


def timed(holds: bool, detail: str, said: str | None = None) -> None:
    """A timing phenomenon: it holds with its margin, or the machine is busy -- other
    programs used more than ``busy_limit`` while the lesson ran or now -- and (where the
    lesson prints a verdict, ``said``) the lesson told the student why its run missed. A
    miss on a quiet machine is kept in ``QUIET_MISSES`` (the check reports every one)."""
    if holds:
        return
    load = machine_load()
    if not load.busy:
        QUIET_MISSES.append(f"{detail} on a quiet machine ({load.text()})")
        return
    assert said is None or SAID in said, (f"{detail} ({load.text()}), and the lesson did not "
                                          f"say why: {said}")


def judged(verdicts: list[Any], text: str, *, label: str | None,
           may_miss_quiet: Sequence[Any] = ()) -> None:
    """Timed verdicts as a lesson printed them (issue 32): each sentence is in ``text`` with
    the numbers it judged; "holds" only where the claim's own numbers lie beyond their noise
    (read from the sample and the claim, not from the verdict's word), and nowhere else in the
    text; on a quiet machine every verdict holds (``timed``); one that does not has its
    replay on dedicated cores said in the text and drawn (``labkit.lessons.dedicated.SHOWN``
    holds "``label``: ..."; ``label`` None: a claim with nothing to replay, such as Ray's
    sleeping tasks, says so instead). The verdicts also in ``may_miss_quiet`` need not hold on a
    quiet machine (runs with more ranks than cores, on purpose; lesson 01's shorter step
    from hiding, which needs a core for gloo's threads that 2 ranks on 2 cores do not have;
    lesson 06's fit, whose small sizes do not hold quiet yet); every other property holds.
    Counted claims never come here: load excuses none."""
    from labkit.analysis.replay import MODEL_LABEL
    from labkit.lessons.dedicated import SHOWN

    log_verdicts(verdicts)
    for v in verdicts:
        assert v.sentence() in text, f"the lesson did not print its verdict: {v.sentence()}"
        s, c = v.sample, v.claim
        inside = s.noise == s.noise and c.lo < s.value - s.noise and s.value + s.noise < c.hi
        assert not v.holds or inside, f"'holds' for numbers that miss: {v.sentence()}"
        if v not in may_miss_quiet:
            timed(v.holds, v.sentence())
        if not v.holds:
            assert MODEL_LABEL in text or "no dedicated-core replay" in text, \
                f"a verdict that is not 'holds' and no replayed number beside it: {text}"
            assert label is None or any(w.startswith(f"{label}:") for w in SHOWN), \
                f"{label}: a verdict that is not 'holds' and no replay drawn ({SHOWN})"
    for line in text.splitlines():
        if "holds" in line:
            assert any(v.holds and v.sentence() in line for v in verdicts), \
                f"'holds' outside a verdict that holds: {line}"
