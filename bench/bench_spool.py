"""The event spool's per-step write, as it is (a shared file mapping) against how it was.

A rank spools the records of every step it finishes (``labkit.trace.spool``), so a killed
rank still has a timeline. Until commit fb18f86 a step's write was a ``pickle`` of the raw
records (enum members and all) and one unbuffered ``write()``; now it is a ``marshal`` of
the records (each op as its value) copied into a shared file mapping. This times both on a
step's ten records (data, forward, loss, backward, four bucket all-reduces, optimizer, the
step), alternating rounds of ``--steps`` writes so drift on a shared machine hits both, and
prints the median microseconds per write and their ratio. One process, no ranks: what the
write itself costs, not the training step around it (docs/benchmarks.md).

    python bench/bench_spool.py [--rounds 10] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import tempfile
import time
from pathlib import Path

from labkit.base.events import Op
from labkit.trace.spool import Spool, read_spool
from labkit.trace.tracer import Tracer

STEP_OPS = (Op.DATA, Op.FORWARD, Op.LOSS, Op.BACKWARD, Op.ALL_REDUCE, Op.ALL_REDUCE,
            Op.ALL_REDUCE, Op.ALL_REDUCE, Op.OPTIMIZER, Op.STEP)
"""One DDP step's records: ten, as docs/benchmarks.md's foundation table counts them."""


def _record_step(tracer: Tracer, step: int) -> None:
    t = tracer.now()
    for k, op in enumerate(STEP_OPS):
        if op is Op.ALL_REDUCE:
            tracer.record(op, t + k, t + k + 1, step=step, bytes=1 << 20, bucket=k - 4)
        else:
            tracer.record(op, t + k, t + k + 1, step=step, cpu_ns=1000 * k)


class _OldSpool:
    """The write before fb18f86: the fresh raw records pickled, one unbuffered write."""

    def __init__(self, path: Path, tracer: Tracer):
        self.tracer, self._written = tracer, 0
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed by close()

    def write(self) -> None:
        fresh, self._written = self.tracer.raw_since(self._written)
        if fresh:
            self._file.write(pickle.dumps(fresh, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self) -> None:
        self._file.close()


def _round(kind: str, folder: Path, steps: int, index: int) -> float:
    """Median ns of one write over ``steps`` steps, on a fresh file and tracer."""
    tracer = Tracer(0)
    path = folder / f"{kind}-{index}.spool"
    spool = Spool(path, tracer, 0) if kind == "mapped" else _OldSpool(path, tracer)
    times = []
    for step in range(steps):
        _record_step(tracer, step)
        t0 = time.perf_counter_ns()
        spool.write()
        times.append(time.perf_counter_ns() - t0)
    if kind == "mapped":  # what was written reads back whole
        assert len(read_spool(path)) == steps * len(STEP_OPS)
    else:
        spool.close()  # type: ignore[union-attr]
    return statistics.median(times[1:])  # the first write opens the file


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args()
    medians: dict[str, list[float]] = {"mapped": [], "pickle+write": []}
    with tempfile.TemporaryDirectory(prefix="bench-spool-") as tmp:
        for i in range(args.rounds):
            order = ("mapped", "pickle+write") if i % 2 == 0 else ("pickle+write", "mapped")
            for kind in order:
                medians[kind].append(_round(kind, Path(tmp), args.steps, i))
    us = {k: statistics.median(v) / 1e3 for k, v in medians.items()}
    out = {"records_per_write": len(STEP_OPS), "rounds": args.rounds, "steps": args.steps,
           "median_us": {k: round(v, 2) for k, v in us.items()},
           "mapped_over_pickle_write": round(us["mapped"] / us["pickle+write"], 3),
           "per_round_us": {k: [round(x / 1e3, 2) for x in v] for k, v in medians.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
