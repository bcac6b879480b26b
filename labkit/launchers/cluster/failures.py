"""Which rank broke an emulated-cluster run, read from what the ranks and agents left behind.

The supervisor hears from its ranks through pipes; under torchrun the evidence is text:

* a rank that raised printed ``{"error": {...}}`` (``labkit.worker --json``) into its own
  log, with its traceback;
* a rank that died silently (``os._exit``, a signal) is named by its torchrun agent's
  "Root Cause" block: ``rank : 1 (local_rank: 0)`` / ``exitcode : -9``;
* peers of a dead rank fail too, with "Connection closed by peer"-like echoes.

The root cause is chosen as the supervisor chooses it: a real exception first, then a
silent death, then the earliest echo.
"""

from __future__ import annotations

import json
import re
import signal

from labkit.base.errors import RankFailure, RunTimeout

_DEATH_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_LOG_TAIL = 3000


def _echo(failure: RankFailure) -> bool:
    from labkit.launchers.verdict import ECHO_MARKERS

    return any(m in failure.message + failure.traceback for m in ECHO_MARKERS)


def reported_errors(rank_logs: dict[int, str]) -> list[RankFailure]:
    """The ``{"error": ...}`` objects ranks printed, in rank order."""
    out = []
    for rank in sorted(rank_logs):
        for line in rank_logs[rank].splitlines():
            if line.startswith('{"error"'):
                e = json.loads(line)["error"]
                out.append(RankFailure(rank if e.get("rank") is None else e["rank"],
                                       e.get("kind", "exception"), e.get("message", ""),
                                       e.get("traceback", "")))
                break
    return out


def deaths(agent_logs: list[str], rank_logs: dict[int, str]) -> list[RankFailure]:
    """Ranks their agent saw exit non-zero or by a signal (torchrun's failure summary)."""
    found: dict[int, RankFailure] = {}
    for text in agent_logs:
        for m in _DEATH_RE.finditer(text):
            rank, code = int(m.group(1)), int(m.group(2))
            if rank in found:
                continue
            if code < 0:
                name = signal.Signals(-code).name
                failure = RankFailure(rank, "signal", f"rank {rank} was killed by {name}")
            else:
                failure = RankFailure(rank, "exit", f"rank {rank} exited with code {code} "
                                      f"without reporting an error")
            tail = rank_logs.get(rank, "")[-_LOG_TAIL:]
            failure.traceback = f"(last output of rank {rank})\n{tail}" if tail.strip() else ""
            found[rank] = failure
    return [found[r] for r in sorted(found)]


def pick_failure(rank_logs: dict[int, str], agent_logs: list[str], host_code: int
                 ) -> tuple[RankFailure, list[RankFailure]]:
    """(root cause, the other failures) of a failed run."""
    errors = reported_errors(rank_logs)
    reported = {f.rank for f in errors}
    dead = [f for f in deaths(agent_logs, rank_logs) if f.rank not in reported]
    real = [f for f in errors if not _echo(f)]
    ordered = real + dead + [f for f in errors if f not in real]
    if not ordered:
        tail = "\n".join(f"--- node {k} (torchrun agent) ---\n{text[-_LOG_TAIL:]}"
                         for k, text in enumerate(agent_logs))
        return RankFailure(None, "exit", f"the emulated cluster exited with {host_code} and "
                                         f"no rank reported an error", tail), []
    return ordered[0], ordered[1:]


def timeout_failure(timeout_s: float, stacks: dict[int, str],
                    status: dict[int, tuple[int, int]]) -> RunTimeout:
    """A timed-out run, named by the supervisor's rule (``labkit.launchers.verdict.hang``) from the same
    status board. ``stacks``: the ranks still running and their Python stacks; ``status``:
    rank -> (step, in comm)."""
    from labkit.launchers.verdict import hang

    running = sorted(stacks)
    return hang(timeout_s, running, {r: status.get(r, (0, 0))[1] != 0 for r in running},
                {r: status.get(r, (0, 0))[0] for r in running}, stacks)
