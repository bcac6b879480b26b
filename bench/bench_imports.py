"""What one installed package costs every process that imports jsonschema: rfc3987-syntax.

jupyter-events depends on ``jsonschema[format-nongpl]``, whose ``rfc3987-syntax`` builds about
35 Earley parsers (lark) when jsonschema is imported, to check the "iri" format that no
Jupyter, Ray or nbgrader schema uses. Ray imports jsonschema in each of its processes, so a
Ray run pays it about ten times; ``make setup`` uninstalls the package and ``labkit doctor``
names it where it is installed.

This script measures both sides on one machine, alternated: "with" as installed, "without"
with a directory first on ``PYTHONPATH`` whose ``rfc3987_syntax`` raises ImportError (what
jsonschema sees when the package is absent; the Ray processes inherit the variable).

1. CPU seconds of a fresh ``python -c "import M"`` for jsonschema, ray and nbformat, the
   median of ``--rounds`` alternated pairs;
2. wall seconds of ``labkit run ddp --launcher ray --world-size 2 --steps 2`` (Ray started and
   stopped by the run), alternated ``--ray-rounds`` times, and the ratio without / with.

Where rfc3987-syntax is not installed (after ``make setup``) there is no "with" side to
measure, and the script says so. Usage: ``python bench/bench_imports.py [--rounds 5]
[--ray-rounds 3]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("jsonschema", "ray", "nbformat")
RAY_RUN = [sys.executable, "-m", "labkit", "run", "ddp", "--launcher", "ray", "--world-size",
           "2", "--steps", "2", "--json", "--no-progress"]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s of the process and the children it waited for)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                       check=False)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ray-rounds", type=int, default=3)
    args = ap.parse_args()
    if importlib.util.find_spec("rfc3987_syntax") is None:
        print("rfc3987-syntax is not installed in this environment (make setup removes it): "
              "nothing to compare")
        return
    with tempfile.TemporaryDirectory() as shim:
        Path(shim, "rfc3987_syntax.py").write_text(
            "raise ImportError('hidden by bench/bench_imports.py')\n")
        sides = {"with": dict(os.environ),
                 "without": {**os.environ, "PYTHONPATH": os.pathsep.join(
                     [shim, *filter(None, [os.environ.get("PYTHONPATH")])])}}
        print(f"1. CPU s of `python -c 'import M'`, median of {args.rounds} alternated pairs")
        for module in MODULES:
            cpu: dict[str, list[float]] = {side: [] for side in sides}
            for _ in range(args.rounds):
                for side, env in sides.items():
                    cpu[side].append(_run([sys.executable, "-c", f"import {module}"], env)[1])
            w, wo = (statistics.median(cpu[s]) for s in ("with", "without"))
            print(f"   {module:<11} with {w:5.2f}  without {wo:5.2f}  saved {w - wo:5.2f}")
        print(f"2. wall s of `{' '.join(RAY_RUN[1:])}`, {args.ray_rounds} alternated pairs")
        walls: dict[str, list[float]] = {side: [] for side in sides}
        for i in range(args.ray_rounds):
            for side, env in sides.items():
                walls[side].append(_run(RAY_RUN, env)[0])
                print(f"   round {i + 1} {side:<8} {walls[side][-1]:6.1f}", flush=True)
        ratios = [wo / w for w, wo in zip(walls["with"], walls["without"])]
        print(f"   median with {statistics.median(walls['with']):.1f}, without "
              f"{statistics.median(walls['without']):.1f}; without / with "
              f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
