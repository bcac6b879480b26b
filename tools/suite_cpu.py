"""A pytest plugin that writes each test's wall time and CPU time, to see where the suite's
time goes: waiting (wall well above CPU) or computing.

    PYTHONPATH=tools SUITE_CPU_DIR=/tmp/suite-cpu .venv/bin/python -m pytest -n 2 \
        --dist loadgroup -p suite_cpu
    .venv/bin/python tools/suite_cpu.py /tmp/suite-cpu        # the summary

One JSON line per test in ``$SUITE_CPU_DIR/<worker>.jsonl``: the node id, its worker's clock
at the start, wall seconds, and CPU seconds of the worker itself and of the children it reaped
during the test (``getrusage``). Processes the test did not reap are not counted: Ray's daemons,
and the ranks a worker's long-lived fork server reaps later; read a distributed test's CPU as a
lower bound.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import pytest

_DIR = os.environ.get("SUITE_CPU_DIR", "suite-cpu")


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    os.makedirs(_DIR, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    t0, (own0, kids0) = time.monotonic(), _cpu()
    yield
    own1, kids1 = _cpu()
    with open(os.path.join(_DIR, f"{worker}.jsonl"), "a") as f:
        f.write(json.dumps({"id": item.nodeid, "start": t0, "wall": time.monotonic() - t0,
                            "self": own1 - own0, "children": kids1 - kids0}) + "\n")


def _group(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    top = path.split("/")[1] if path.count("/") >= 1 else path
    return path if top == "distributed" else top


def summary(folder: Path) -> str:
    """Each worker's busy time, then wall and CPU seconds summed by test file or folder."""
    rows = [json.loads(line) | {"worker": f.stem}
            for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]
    lines = []
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        lines.append(f"{worker}: {len(mine)} tests, busy {sum(r['wall'] for r in mine):.0f} s")
    groups: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        g = groups[_group(r["id"])]
        g[0] += r["wall"]
        g[1] += r["self"] + r["children"]
        g[2] += 1
    lines.append(f"{'wall s':>8} {'cpu s':>8} {'tests':>6}  group")
    for name, (wall, cpu, n) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{wall:8.0f} {cpu:8.0f} {int(n):6d}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1] if len(sys.argv) > 1 else _DIR)))
