"""Each lesson notebook's run-all time on this machine, beside its budget.

Runs every ``notebooks/NN_*.ipynb`` top to bottom in a fresh headless kernel (nbclient, as
``tests/notebooks/test_notebooks.py`` does, on a copy: the committed notebook keeps no
outputs) and prints one row per lesson: the run-all wall time, the budget (60 s; 120 s for
lesson 12, Ray, whose Train fits pay Ray's own start-up), whether it is within, and the
slowest cells -- where a lesson engineer starts looking (profile those cells, don't guess).
The load average before and after each notebook is printed too: a number measured at load 3
on 2 cores says little about a quiet machine.

It also finds the waits a student sits through in silence (issue 39: every wait over about
5 s shows progress): for each cell, the longest stretch between its start, each message that
changes what the page shows (printed text, a figure, a progress bar's redraw) and its end.
Cells silent for longer than ``SILENCE_S`` are listed.

Usage: ``python bench/bench_notebooks.py [--only 03 05] [--json out.json] [--timeout 600]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUDGET_S = 60.0
BUDGETS_S = {"12": 120.0}
"""Per-lesson exceptions to the 60 s budget (issue 27): lesson 12 runs Ray Train."""
SILENCE_S = 5.0
"""The longest a cell may run without showing anything new (issue 39, item 3)."""
SHOWN = {"stream", "display_data", "update_display_data", "execute_result", "error",
         "clear_output", "comm_msg"}
"""The kernel messages a student sees: output, and a widget's redraw (a tqdm bar's ``comm_msg``)."""


def longest_silence(start: float, shown: list[float], end: float) -> tuple[float, float]:
    """The longest gap between ``start``, the times something was shown, and ``end``, and
    when it began (seconds after ``start``)."""
    times = [start, *sorted(t for t in shown if start <= t <= end), end]
    gap, began = max((b - a, a) for a, b in zip(times, times[1:]))
    return gap, began - start


def budget_for(path: Path) -> float:
    return BUDGETS_S.get(path.name[:2], BUDGET_S)


def run_notebook(path: Path, timeout_s: float) -> dict[str, Any]:
    """Execute ``path`` headless; return its wall time, the slowest cells and any error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    class Watched(NotebookClient):  # type: ignore[misc]
        """Notes when each shown message arrives, as a student's page would redraw."""

        def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
            if msg.get("msg_type") in SHOWN:
                shown.append(time.monotonic())
            return super().process_message(msg, cell, cell_index)

    nb = nbformat.read(path, as_version=4)
    cell_s: list[tuple[float, int, str]] = []
    silent: list[dict[str, Any]] = []
    shown: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-nb-") as tmp:
        client = Watched(nb, timeout=timeout_s, kernel_name="python3",
                         resources={"metadata": {"path": tmp}})
        error = None
        os.environ["LABKIT_HOME"] = tmp  # quiz progress of lesson 08 stays out of ~/.labkit
        load_before = os.getloadavg()[0]
        start = time.monotonic()
        # 1. one kernel for the whole notebook, as "Run All" in JupyterLab; 2. time each cell
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                t0 = time.monotonic()
                shown.clear()
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as err:
                    error = f"cell {index}: {str(err).strip().splitlines()[-1][:200]}"
                    break
                finally:
                    t1 = time.monotonic()
                    cell_s.append((t1 - t0, index, cell.source.splitlines()[0]
                                   if cell.source else ""))
                    quiet, since = longest_silence(t0, shown, t1)
                    if quiet > SILENCE_S:
                        silent.append({"cell": index, "s": t1 - t0, "silent_s": quiet,
                                       "from_s": since})
        wall = time.monotonic() - start
    slowest = sorted(cell_s, reverse=True)[:3]
    return {"notebook": path.name, "wall_s": wall, "budget_s": budget_for(path),
            "within": error is None and wall <= budget_for(path), "error": error,
            "load_before": load_before, "load_after": os.getloadavg()[0],
            "slowest_cells": [{"cell": i, "s": s, "first_line": line} for s, i, line in slowest],
            "silent_cells": silent}


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (what docs/benchmarks.md records)."""
    out = ["| notebook | run-all | budget | within | load before / after | slowest cells "
           f"| silent > {SILENCE_S:.0f} s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = ", ".join(f"#{c['cell']} {c['s']:.1f} s" for c in r["slowest_cells"])
        quiet = ", ".join(f"#{c['cell']} {c['silent_s']:.1f} s from {c['from_s']:.1f} s of "
                          f"{c['s']:.1f} s"
                          for c in r["silent_cells"]) or "none"
        verdict = "yes" if r["within"] else ("ERROR " + r["error"] if r["error"] else "**no**")
        out.append(f"| {r['notebook']} | {r['wall_s']:.1f} s | {r['budget_s']:.0f} s | {verdict} "
                   f"| {r['load_before']:.1f} / {r['load_after']:.1f} | {cells} | {quiet} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, metavar="NN",
                    help="lesson numbers to run, e.g. --only 03 12 (default: all)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds one cell may run before the notebook counts as failed")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if args.only:
        paths = [p for p in paths if p.name[:2] in args.only]
    print(f"{len(paths)} notebooks, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} before the first", flush=True)
    rows = []
    for path in paths:
        row = run_notebook(path, args.timeout)
        rows.append(row)
        print(f"{path.name:<32} {row['wall_s']:7.1f} s  budget {row['budget_s']:.0f} s  "
              f"{'ok' if row['within'] else 'OVER' if not row['error'] else row['error']}"
              + "".join(f"  cell #{c['cell']} silent {c['silent_s']:.1f} s from {c['from_s']:.1f} s"
                        for c in row["silent_cells"]), flush=True)
    print()
    print(table(rows))
    total = sum(r["wall_s"] for r in rows)
    print(f"\n{sum(r['within'] for r in rows)}/{len(rows)} within budget; {total:.0f} s in all")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
