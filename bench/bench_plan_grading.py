"""ps7's tolerances, measured: the model answer of Q3 against the planner on hidden scenarios.

    python bench/bench_plan_grading.py [--students 20]

For each student's three hidden scenarios (``solutions/_grading/ps7_planning_at_scale.py``)
the solution notebook's ``plan_layout`` chooses a layout and predicts its memory and MFU
with the notebook's stated rules; the planner (``labkit.theory.plan``) predicts the same
layout and finds its best one. Prints the ranges of memory (yours / planner's), MFU (yours /
planner's) and throughput (your layout's / the best layout's tokens/s per GPU): the grading
tolerances (``labkit.grading.at_scale``: 5 %, 20 %, 75 %) must hold them with room.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support, when run as a script

from labkit.grading import at_scale, instructor  # noqa: E402
from labkit.theory.plan import predict  # noqa: E402
from tests.support.answers import model_answers  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--students", type=int, default=20)
    args = p.parse_args()
    grader = instructor.load("ps7_planning_at_scale", REPO)
    ns = model_answers("ps7_planning_at_scale")
    mem, mfu, share = [], [], []
    for i in range(args.students):
        for sc in grader.scenarios(f"student{i}"):
            ans = ns["plan_layout"](sc)
            model, net, training = at_scale.objects(sc)
            q = predict(model, net, training, at_scale.planner_layout(sc, ans))
            best = at_scale.best_without_zero3(model, net, training)
            mem.append(ans["memory_gb"] * 1e9 / q.memory_bytes)
            mfu.append(ans["mfu"] / q.mfu)
            share.append(q.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu)
    print(f"{len(mem)} scenarios: memory yours/planner's {min(mem):.3f}-{max(mem):.3f}, "
          f"MFU yours/planner's {min(mfu):.3f}-{max(mfu):.3f}, "
          f"tokens/s of your layout / the best {min(share):.3f}-{max(share):.3f}")


if __name__ == "__main__":
    main()
