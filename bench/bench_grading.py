"""How long each cell of the model solutions takes to autograde, against the time limits.

The per-cell limits in nbgrader_config.py (``SandboxedExecute.cell_timeout`` for student
cells, ``test_timeout`` for a test cell with everything it runs in the box) must fit the
slowest real-rank check with margin. This grades every assignment's solution notebook with
``labkit submit`` in a temporary copy of the course (the sandbox included) and prints, per
assignment, the slowest student cell and the slowest test cell, read from the executor's
log, next to the limits.

    python bench/bench_grading.py [ps3_build_it ...]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"cell (\d+) \(([^,]+), (test|box)\): ([\d.]+) s")


def main() -> int:
    from labkit.grading import course
    from labkit.grading.submit import submit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", default=None)
    args = parser.parse_args()
    names = args.assignments or course.assignments(REPO)
    cfg = (REPO / "nbgrader_config.py").read_text()
    limits = {k: float(re.search(rf"{k} = ([\d.]+)", cfg).group(1))  # type: ignore[union-attr]
              for k in ("cell_timeout", "test_timeout")}
    print(f"limits: student cell {limits['cell_timeout']:g} s, test cell "
          f"{limits['test_timeout']:g} s")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        root = Path(tmp)
        shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
        shutil.copytree(REPO / "solutions", root / "solutions")
        shutil.copytree(REPO / "exercises", root / "exercises")
        for name in names:
            nb = root / f"{name}.ipynb"
            shutil.copy(root / "solutions" / name / f"{name}.ipynb", nb)
            t0 = time.monotonic()
            result = submit(name, [nb], student="bench", root=root)
            rows = [(int(n), gid, kind, float(s)) for n, gid, kind, s in LINE.findall(result.log)]
            tests = [r for r in rows if r[2] == "test"]
            boxed = [r for r in rows if r[2] == "box"]
            slow = max(tests, key=lambda r: r[3])
            worst = max(worst, slow[3] / limits["test_timeout"])
            print(f"{name}: {result.score:g}/{result.max_score:g} in {time.monotonic() - t0:.0f} s "
                  f"({result.sandbox}); slowest test cell {slow[1]} {slow[3]:.1f} s "
                  f"({slow[3] / limits['test_timeout']:.0%} of its limit); slowest student "
                  f"cell {max(r[3] for r in boxed):.1f} s")
            for _, gid, _, seconds in tests:
                print(f"    {gid:<20s} {seconds:6.1f} s")
    print(f"largest share of a test-cell limit used: {worst:.0%}")
    return 0 if worst < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
