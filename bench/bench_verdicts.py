"""Do the lessons' timed verdicts keep their word from run to run? (issue 32, "beside two CPU
hogs, twice: the verdict words are the same in both runs or inconclusive").

    python bench/bench_verdicts.py [--only 01 03] [--rounds 2] [--hogs 2]

Executes each chosen lesson ``--rounds`` times, alternated (01 03 01 03 ...), through the
notebook test's own harness (``tests/notebooks/test_notebooks.execute_lesson``: the claims
check runs in the lesson's kernel and fails the round if the lesson broke a rule of
``tests/notebooks/claims``), beside ``--hogs`` CPU-bound processes, and collects every
verdict sentence the lesson printed ("<rule>: <what> <value> +- <noise>, the rule wants ...
-- holds / contradicted by this run / inconclusive on this machine (...)"). It prints one
row per verdict with its word in each round, and counts the flips: a verdict that reads
"holds" in one round and "contradicted" in another. A round that failed prints why.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TIMED = ("01", "03", "05", "06", "09", "10", "11", "12")
"""The lessons with timed verdicts."""
WORDS = {"-- holds": "holds", "-- contradicted by this run": "contradicted",
         "-- inconclusive on this machine": "inconclusive"}
HOG = "while True:\n    pass\n"


def verdicts(nb: Any) -> dict[str, str]:
    """Every verdict sentence in the executed notebook's outputs: its rule and quantity (the
    sentence up to its numbers) -> its word."""
    found = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            for line in str(out.get("text", "")).splitlines():
                word = next((w for key, w in WORDS.items() if key in line), None)
                if word is None or ", the rule wants" not in line:
                    continue
                head = line.strip().split(", the rule wants")[0]
                key = re.sub(r"\s[-+]?\d[\d.]*(\s\+-\s[\d.]+)?(\s\(one run.*\))?$", "", head)
                found[key] = word
    return found


def main() -> None:
    from nbclient.exceptions import CellExecutionError

    from tests.notebooks.test_notebooks import execute_lesson

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", default=list(TIMED))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--hogs", type=int, default=2)
    args = p.parse_args()
    paths = [next((ROOT / "notebooks").glob(f"{n}_*.ipynb")) for n in args.only]
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    words: dict[tuple[str, str], list[str]] = defaultdict(list)
    try:
        for round_ in range(args.rounds):
            for path in paths:
                t0 = time.monotonic()
                with tempfile.TemporaryDirectory(prefix="bench-verdicts-") as tmp:
                    try:
                        nb = execute_lesson(path, Path(tmp))
                        seen, why = verdicts(nb), ""
                    except (AssertionError, CellExecutionError) as err:  # say why, go on
                        seen, why = {}, str(err).strip().splitlines()[-1][:300]
                for key, word in seen.items():
                    words[(path.stem[:2], key)].append(f"{round_ + 1}:{word}")
                print(f"round {round_ + 1} {path.stem}: {len(seen)} verdicts, "
                      f"{time.monotonic() - t0:.0f} s" + (f" -- FAILED: {why}" if why else ""),
                      flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    flips = 0
    for (lesson, key), rounds in sorted(words.items()):
        kinds = {w.split(":")[1] for w in rounds}
        flip = {"holds", "contradicted"} <= kinds
        flips += flip
        print(f"{'FLIP ' if flip else '     '}{lesson} {' '.join(rounds):40s} {key[:110]}")
    print(f"# {len(words)} verdicts, {flips} flipped between holds and contradicted, "
          f"{args.hogs} hogs, {args.rounds} rounds")


if __name__ == "__main__":
    main()
