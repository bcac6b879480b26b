"""Amdahl's law, measured: the same job on 1, 2 (and 4) ranks, and the part that does not scale.

Strong scaling: the global batch is fixed and split over n ranks, one core each (one rank
stands for one GPU), so perfect scaling would divide the step time by n. What divides is
the forward and backward pass over the samples; what does not is the work every rank
repeats (the optimizer update on a full replica, Python and launch overheads) and the
communication data parallelism adds (the exposed part of the all-reduce). Fitting
``t_n / t_1 = (1 - f) + f / n`` to the measured step times gives Amdahl's parallel fraction
f (``labkit.theory.fit_amdahl``), and with it the speedup this job would reach on 8 ranks —
next to seed 003's "8 GPUs give 6x" (f = 0.952) and the mini challenge's 2x on 4 GPUs
(f >= 0.667). Torch-free: it starts real runs and reads their timelines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.base.devices import cpu_count
from labkit.base.events import Lane, Op
from labkit.config.run import ModelConfig
from labkit.theory import amdahl_fraction_for, amdahl_speedup, fit_amdahl

SCALES = (Op.FORWARD, Op.BACKWARD)


@dataclass
class AmdahlResult:
    """Measured step times per rank count, their split, and the fitted law."""

    step_times: dict[int, float]
    breakdown: list[dict[str, Any]]
    parallel_fraction: float
    global_batch: int
    runs: dict[int, Any] = field(default_factory=dict)
    """Per rank count, the repeat whose step is the median: the run the table splits."""
    repeats: dict[int, list[float]] = field(default_factory=dict)
    """Per rank count, every alternated repeat's step time (s): the verdict's noise."""

    @property
    def speedups(self) -> dict[int, float]:
        return {n: self.step_times[1] / t for n, t in self.step_times.items()}

    def predicted(self, n: int) -> float:
        return amdahl_speedup(self.parallel_fraction, n)

    def text(self) -> str:
        lines = [f"{'ranks':>5} {'step ms':>9} {'speedup':>8} {'scales ms':>10} "
                 f"{'serial ms':>10} {'exposed comm ms':>16}"]
        for row in self.breakdown:
            lines.append(f"{row['ranks']:>5} {row['step_ms']:>9.2f} {row['speedup']:>8.2f} "
                         f"{row['scales_ms']:>10.2f} {row['serial_ms']:>10.2f} "
                         f"{row['exposed_comm_ms']:>16.2f}")
        f = self.parallel_fraction
        lines += [f"fitted parallel fraction f = {f:.3f}: Amdahl predicts "
                  f"{self.predicted(8):.2f}x on 8 ranks (seed 003's 8 GPUs -> 6x needs "
                  f"f = {amdahl_fraction_for(6, 8):.3f}; the mini challenge, 2x on 4, needs "
                  f"f >= {amdahl_fraction_for(2, 4):.3f})"]
        lines += self.verdicts()
        lines += self.why()
        return "\n".join(lines)

    def verdicts(self) -> list[str]:
        """The speedup on 2 ranks judged (``dp_verdicts.speedup_verdict``), and where it does
        not hold, the same speedup on the two runs replayed on dedicated cores."""
        from labkit.lessons.dp_verdicts import speedup_replay, speedup_verdict

        if not {1, 2} <= set(self.runs):
            return []
        v = speedup_verdict(self)
        return [v.sentence()] + ([] if v.holds else ["  " + speedup_replay(self.runs, v)])

    def why(self) -> list[str]:
        """Per world size beyond 1, what splitting the batch saved and what it cost, read
        from the runs: the sentences that explain f."""
        one = self.breakdown[0]
        out = []
        for row in self.breakdown[1:]:
            n = row["ranks"]
            saved = one["scales_ms"] - row["scales_ms"]
            ideal = one["scales_ms"] * (1 - 1 / n)
            cost = (row["exposed_comm_ms"] - one["exposed_comm_ms"]
                    + row["serial_ms"] - one["serial_ms"])
            out.append(f"{n} ranks: splitting the batch saved {saved:.1f} ms of compute per "
                       f"step (ideal {ideal:.1f}); communication and repeated work added "
                       f"{cost:.1f} ms" + (": more than it saved" if cost >= saved else ""))
            if saved < 0.7 * ideal:
                out.append(f"  the compute did not split {n} ways: {n} ranks share "
                           f"{cpu_count()} cores with gloo's threads, so they wait for a core")
        return out


def _split(run: Any) -> dict[str, float]:
    """Per step, mean over ranks: compute that scales, compute every rank repeats, exposed
    communication (waiting in comm while not computing)."""
    tl = run.timeline.window()
    steps = max(len(tl.steps()), 1)
    out = {"scales": 0.0, "serial": 0.0, "exposed": 0.0}
    for r in tl.ranks:
        scales = sum(e.dur_ns for e in tl.select(rank=r) if e.op in SCALES)
        repeat = sum(e.dur_ns for e in tl.select(rank=r, lane=Lane.COMPUTE)
                     if e.op not in SCALES)
        exposed = tl.comm_ns(r) - tl.overlap_ns(r)
        out["scales"] += scales / tl.world_size
        out["serial"] += repeat / tl.world_size
        out["exposed"] += exposed / tl.world_size
    return {k: v / steps / 1e6 for k, v in out.items()}


def amdahl_experiment(world_sizes: tuple[int, ...] | None = None, *, global_batch: int = 1024,
                      strategy: str = "ddp", steps: int = 8, repeats: int = 3,
                      model: ModelConfig | None = None, **run_kwargs: Any) -> AmdahlResult:
    """Run the same job (``global_batch`` split over n ranks, one core each) for every n in
    ``world_sizes`` (default: 1, 2 and 4 where this machine has the cores), the rank counts
    alternated ``repeats`` times (``labkit.lessons.measure.alternate``: a busy moment hits
    every count alike); each count's step is the median of its repeats."""
    from functools import partial

    from labkit.api import run
    from labkit.lessons.measure import alternate

    sizes = world_sizes or tuple(n for n in (1, 2, 4) if n <= cpu_count())
    model = model or ModelConfig(width=512, depth=4)
    run_kwargs.setdefault("progress", False)
    numbers, results = alternate(
        {n: partial(run, strategy=strategy, world_size=n, batch_size=global_batch // n,
                    steps=steps, model=model, threads_per_rank=1, **run_kwargs)
         for n in sizes}, repeats, desc="Amdahl sweep")
    runs = {n: sorted(results[n], key=lambda r: r.step_time_s)[(len(results[n]) - 1) // 2]
            for n in sizes}
    times = {n: r.step_time_s for n, r in runs.items()}
    rows = []
    for n, r in runs.items():
        split = _split(r)
        rows.append({"ranks": n, "step_ms": times[n] * 1e3, "speedup": times[1] / times[n],
                     "scales_ms": split["scales"], "serial_ms": split["serial"],
                     "exposed_comm_ms": split["exposed"]})
    return AmdahlResult(times, rows, fit_amdahl(times), global_batch, runs,
                        {n: list(v) for n, v in numbers.items()})

