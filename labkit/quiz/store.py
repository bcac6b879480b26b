"""Quiz progress saved between uses: a small JSON file in the student's labkit home.

Location: ``quiz.json`` in labkit's state directory (``labkit.base.places.state_dir``:
``$LABKIT_HOME``, an existing ``~/.labkit``, else the platform's user data directory). The
file holds every finished attempt (seed, score, per-question correctness), the best score,
per-concept accuracy, and the attempt in progress (``current``: its seed and the answers
given so far), saved after every answer so a kernel restart or a closed terminal loses
nothing: the widget and ``labkit quiz`` both resume it. Writes are atomic (a temporary file
in the same folder, fsync, then ``os.replace``), so a crash mid-write never leaves half a
file.

A file that is not valid progress JSON (hand-edited, truncated by a full disk) is moved
aside to ``quiz.json.corrupt`` and a fresh record starts; ``ProgressStore.warning`` says
so. Errors from the file system itself (no permission, read-only home) are raised as
``OSError``; the CLI and the widget report them and carry on without saving.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit.base.files import write_json_atomic
from labkit.base.places import state_dir
from labkit.quiz.engine import Attempt, Quiz

SCHEMA_VERSION = 1


def labkit_home() -> Path:
    """Where the progress file lives (``labkit.base.places.state_dir``)."""
    return state_dir()


def default_path() -> Path:
    return labkit_home() / "quiz.json"


def _empty() -> dict[str, Any]:
    return {"schema": SCHEMA_VERSION, "attempts": [], "best": None, "concepts": {}}


class ProgressStore:
    """Reads and updates the progress file; each ``record`` is one atomic write."""

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.warning: str | None = None

    def load(self) -> dict[str, Any]:
        """The saved progress, or an empty record when there is none yet."""
        if not self.path.exists():
            return _empty()
        text = self.path.read_text(encoding="utf-8", errors="replace")  # OSError propagates
        try:
            data, problem = json.loads(text), None
        except ValueError as exc:
            data, problem = None, str(exc)
        if problem is None and not (isinstance(data, dict)
                                    and isinstance(data.get("attempts"), list)):
            problem = "not a labkit quiz progress object"
        if problem is not None:
            aside = self.path.with_name(self.path.name + ".corrupt")
            try:
                os.replace(self.path, aside)
                where = f"moved it to {aside}"
            except OSError:
                where = "left it in place"
            self.warning = (f"could not read quiz progress {self.path} ({problem}); "
                            f"{where} and started a fresh record")
            return _empty()
        base = _empty()
        base.update(data)
        return base

    # ---- the attempt in progress -------------------------------------------------------
    def save_current(self, attempt: Attempt, *, source: str = "api") -> None:
        """Save the unfinished attempt: its seed and every answer given so far."""
        data = self.load()
        data["current"] = {
            "seed": attempt.seed, "source": source,
            "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "answers": {qid: r.given for qid, r in attempt.results.items()}}
        self.save(data)

    def current(self) -> dict[str, Any] | None:
        """The saved attempt in progress, or None (also when the entry is malformed)."""
        cur = self.load().get("current")
        ok = (isinstance(cur, dict) and type(cur.get("seed")) is int
              and isinstance(cur.get("answers"), dict))
        return cur if ok else None

    def clear_current(self) -> None:
        data = self.load()
        if data.pop("current", None) is not None:
            self.save(data)

    def resume(self, quiz: Quiz | None = None) -> Attempt | None:
        """Rebuild the attempt in progress (same seed, same answers), or None."""
        cur = self.current()
        if cur is None:
            return None
        attempt = (quiz or Quiz()).new_attempt(cur["seed"])
        for qid, given in cur["answers"].items():
            if qid in attempt.ids and isinstance(given, (str, int, float)):
                attempt.answer(qid, given)
        return attempt

    # ---- finished attempts -----------------------------------------------------------------
    def record(self, attempt: Attempt, *, source: str = "api") -> dict[str, Any]:
        """Add a scored attempt, update best score and per-concept accuracy, save.

        The attempt in progress is cleared when it is this one (same seed).
        """
        data = self.load()
        if (data.get("current") or {}).get("seed") == attempt.seed:
            data.pop("current", None)
        entry: dict[str, Any] = {
            "seed": attempt.seed,
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": source,
            "score": attempt.score,
            "total": attempt.total,
            "percent": attempt.percent,
            "passed": attempt.passed,
            "results": [{"id": r.id, "concept": r.concept.value, "correct": r.correct}
                        for r in attempt.ordered_results()],
        }
        data["attempts"].append(entry)
        best = data.get("best")
        if not best or entry["percent"] > best.get("percent", -1):
            data["best"] = {k: entry[k] for k in ("seed", "score", "total", "percent",
                                                   "passed", "finished_at")}
        concepts: dict[str, dict[str, Any]] = data.setdefault("concepts", {})
        for r in entry["results"]:
            c = concepts.setdefault(r["concept"], {"answered": 0, "correct": 0})
            c["answered"] += 1
            c["correct"] += int(r["correct"])
            c["accuracy"] = round(c["correct"] / c["answered"], 4)
        self.save(data)
        return data

    def save(self, data: dict[str, Any]) -> None:
        """Write atomically: temp file in the same folder, fsync, rename over the old one."""
        write_json_atomic(self.path, data, indent=2, sort_keys=True)

    def summary(self) -> str:
        """A few lines for a terminal: attempts, best score, weakest concepts."""
        data = self.load()
        n = len(data["attempts"])
        if n == 0:
            return "No quiz attempts saved yet."
        best = data["best"] or {}
        lines = [f"{n} attempt(s) saved in {self.path}",
                 (f"best: {best.get('score')}/{best.get('total')} ({best.get('percent')}%)"
                  f" with seed {best.get('seed')}")]
        ranked = sorted(data["concepts"].items(), key=lambda kv: kv[1].get("accuracy", 0))
        for name, c in ranked:
            lines.append(f"  {name:<18} {c['correct']}/{c['answered']} correct")
        return "\n".join(lines)
