"""What every front end of ``labkit run`` prints and writes, with its exit codes.

``labkit run`` (``labkit.cli``) and the torchrun worker (``labkit.launchers.torchrun``)
share these, so a run reads the same whoever started it:

* ``output_problems(args)``: whether ``--trace`` / ``--timeline`` can be written, checked
  before any process starts (a run must never finish only to lose its results);
* ``report(args, result)``: write the files and print the result (``--json``: one object;
  else ``labkit.analysis.report.describe``'s summary);
* ``fail_input`` / ``fail_run`` / ``save_partial``: a refused input (exit 2), a failed run
  (exit 1) and what the ranks recorded before it failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from labkit.analysis.report import describe
from labkit.base.errors import RankFailure, RunFailed
from labkit.base.files import dir_problem


def output_problem(flag: str, path: str) -> str | None:
    """Why ``path`` cannot take a run's output file (None: it can), found by trying: its
    directory must take a file and have room (``labkit.base.files.dir_problem``), and the
    file itself must open for writing without being truncated (a file created only to try
    is removed again). Trying is the only honest test: root passes every permission check
    yet cannot create ``/proc/x.json``."""
    target = Path(path)
    example = f"e.g. {flag} run.json"
    if target.is_dir():
        return f"{flag} {path!r} is a directory; give a file name, e.g. {flag} {target / 'run.json'}"
    why = dir_problem(target.parent)
    if why is not None:
        return (f"{flag} {path!r}: its directory {str(target.parent)!r} {why}; the file must go "
                f"in a writable directory with room for it, {example}")
    try:
        existed = target.exists()
        with open(target, "r+b" if existed else "xb"):
            pass
        if not existed:
            target.unlink()
    except OSError as exc:
        return (f"{flag} {path!r} cannot be written ({exc.strerror or exc}); choose a file in a "
                f"writable directory, {example}")
    return None


def output_problems(args: argparse.Namespace) -> list[str]:
    """``output_problem`` for ``--trace`` and ``--timeline`` (call before starting ranks)."""
    flags = (("--trace", getattr(args, "trace", None)),
             ("--timeline", getattr(args, "timeline", None)))
    return [p for flag, path in flags if path and (p := output_problem(flag, path)) is not None]


def report(args: argparse.Namespace, result: Any, extra_json: dict[str, Any] | None = None
           ) -> int:
    """Write --trace / --timeline and print the result (--json: one object); exit code 0,
    or 1 when an output file could not be written after all (the result is still printed)."""
    code = 0
    try:
        if args.trace:
            result.save_trace(args.trace)
        if args.timeline:
            result.timeline.save(args.timeline)
    except OSError as exc:
        print(f"labkit: error: the run finished but its output could not be written: {exc}",
              file=sys.stderr)
        code = 1
    if args.json:
        print(json.dumps({**result.to_json(), **(extra_json or {})}, default=str), flush=True)
    else:
        print(describe(result), flush=True)
    return code


def fail_input(args: argparse.Namespace, message: str) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"error": {"rank": None, "kind": "config", "message": message,
                                    "traceback": ""}}))
    print(f"labkit: error: {message}", file=sys.stderr)
    return 2


def save_partial(args: argparse.Namespace, err: RunFailed) -> None:
    """--timeline / --trace still write what the ranks recorded before a failure."""
    if err.timeline is None or not err.timeline.events:
        return
    if args.timeline:
        err.timeline.save(args.timeline)
        print(f"labkit: the timeline up to the failure is in {args.timeline}", file=sys.stderr)
    if args.trace:
        err.timeline.to_chrome(args.trace)
        print(f"labkit: the trace up to the failure is in {args.trace}", file=sys.stderr)


def fail_run(args: argparse.Namespace, failure: RankFailure) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"error": failure.to_json()}))
    where = f"rank {failure.rank}" if failure.rank is not None else "the run"
    print(f"labkit: {where} failed ({failure.kind}): {failure.message}", file=sys.stderr)
    if failure.traceback:
        print(f"\n--- {where} ---\n{failure.traceback.rstrip()}", file=sys.stderr)
    return 1
