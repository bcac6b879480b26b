"""One exception family for everything labkit raises at a user.

Every message names the offending value, the rule it broke, and (where it helps) a valid
example, so a student can fix the call without reading labkit's source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class LabError(Exception):
    """Base class of every error labkit raises on purpose."""


class ConfigError(LabError, ValueError):
    """A configuration value broke a rule; raised before any process starts."""

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class CheckpointError(LabError):
    """A checkpoint cannot be loaded: the message names the file and the check it failed."""


@dataclass
class RankFailure:
    """What went wrong on one rank, as the supervisor saw it."""

    rank: int | None
    kind: str  # "exception" | "exit" | "signal" | "timeout" | "result" | "start"
    message: str
    traceback: str = ""

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "kind": self.kind, "message": self.message,
                "traceback": self.traceback}


class RunFailed(LabError):
    """A multi-process run failed; ``failure`` names the first rank that failed and how.

    ``others`` holds what the remaining ranks reported (often just "connection closed by
    peer" echoes of the first failure), kept for debugging but never shown first.
    ``timeline`` holds what every rank recorded before the failure (a ``Timeline``, or None
    where nothing was recorded): plot it to see where each rank was when the run broke.
    """

    timeline: Any = None

    def __init__(self, failure: RankFailure, others: list[RankFailure] | None = None):
        self.failure = failure
        self.others = others or []
        where = f"rank {failure.rank}" if failure.rank is not None else "the run"
        head = f"{where} failed ({failure.kind}): {failure.message}"
        body = f"\n\n--- traceback from {where} ---\n{failure.traceback}" if failure.traceback else ""
        super().__init__(head + body)

    @property
    def rank(self) -> int | None:
        return self.failure.rank

    def _render_traceback_(self) -> list[str]:
        """What IPython / Jupyter shows for this error: the failing rank's block, not the
        supervisor's frames and not the other ranks' echoes."""
        f = self.failure
        where = f"rank {f.rank}" if f.rank is not None else "the run"
        red, bold, reset = "\x1b[31m", "\x1b[1m", "\x1b[0m"
        lines = [f"{red}{bold}{type(self).__name__}: {where} failed ({f.kind}){reset}",
                 f"{bold}{f.message}{reset}", ""]
        if f.traceback:
            lines += [f"{bold}--- traceback from {where} ---{reset}", f.traceback.rstrip()]
        if self.others:
            lines += ["", f"({len(self.others)} other rank(s) stopped after this failure; "
                          f"see err.others)"]
        if self.timeline is not None and self.timeline.events:
            lines += [f"(what the ranks recorded before it: err.timeline, "
                      f"{len(self.timeline.events)} events; labkit.plot_timeline(err.timeline))"]
        return lines

    @property
    def kind(self) -> str:
        return self.failure.kind


class RunTimeout(RunFailed):
    """The run exceeded its timeout; ``failure.message`` names the ranks still running."""
