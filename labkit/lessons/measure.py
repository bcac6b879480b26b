"""The measurement protocol behind every timed claim of the lessons (issue 32).

A laptop's timings swing with whatever else runs; a claim judged on one run of each variant
flips between two runs. So a lesson that times something:

1. runs the variants **alternated** -- A B A B ... -- for ``repeats`` rounds, so a busy
   moment hits both sides of a comparison, and discards ``warmup`` rounds;
2. reduces each run to **one number** that no single rank's outlier makes: by default the
   median over steps of the step time (a synchronous step lasts as long as its slowest rank;
   the first step, which pays for warm-up, is skipped: ``Timeline.median_step_s``);
3. keeps every run's number, so the claim gets the statistic it needs and the **noise**
   (``labkit.analysis.claims.Sample``: the least for a time or a bubble, the median of
   pair-by-pair ratios for a comparison, half the spread as the noise);
4. hands (effect, prediction, noise) to ``labkit.analysis.claims.judge``, whose verdict is the
   lesson's sentence.

``alternate`` takes plain callables, so it times ``labkit.run`` calls, ``Pool.run`` calls or
anything else. A sweep shows one progress bar over all its runs (``labkit.base.progress``:
a bar in a notebook once the sweep has lasted a few seconds, nothing in a pipe), and a
lesson can add its own line per run through ``on_run``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from labkit.analysis.claims import Sample
from labkit.base.progress import SWEEP_DELAY_S, Progress


def step_seconds(result: Any) -> float:
    """One run's number: its median step time (seconds), first step skipped."""
    return float(result.step_time_s)


def alternate(variants: Mapping[Any, Callable[[], Any]], repeats: int = 3, *, warmup: int = 0,
              measure: Callable[[Any], float] = step_seconds,
              on_run: Callable[[Any, int, float], None] | None = None,
              desc: str = "runs", progress: bool | None = None
              ) -> tuple[dict[Any, list[float]], dict[Any, list[Any]]]:
    """Run every variant once per round, in the order given, for ``warmup + repeats`` rounds;
    return each variant's numbers (``measure`` of each kept run) and the kept results.
    ``on_run(name, round, number)`` sees each run as it lands (a lesson's progress line);
    one bar named ``desc`` counts the runs (``progress``: None shows it where it can redraw
    once the sweep lasts 5 s, True always, False never)."""
    if not variants:
        raise ValueError("alternate needs at least one variant")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats ({repeats}) must be >= 1 and warmup ({warmup}) >= 0")
    numbers: dict[Any, list[float]] = {name: [] for name in variants}
    results: dict[Any, list[Any]] = {name: [] for name in variants}
    rounds = warmup + repeats
    with Progress(desc, total=rounds * len(variants), unit="run", enabled=progress,
                  delay=SWEEP_DELAY_S) as bar:
        for round_ in range(rounds):
            for name, run in variants.items():
                result = run()
                value = measure(result)
                if round_ >= warmup:
                    numbers[name].append(value)
                    results[name].append(result)
                bar.step(f"{name} ({'warm-up' if round_ < warmup else f'repeat {round_ - warmup + 1}'})")
                if on_run is not None:
                    on_run(name, round_ - warmup, value)
    return numbers, results


def ratio(numbers: Mapping[str, Sequence[float]], top: str, bottom: str) -> Sample:
    """``top`` / ``bottom`` pair by pair (the runs of one round shared its load)."""
    return Sample.ratio(numbers[top], numbers[bottom])


def least(numbers: Mapping[str, Sequence[float]], name: str) -> Sample:
    """A time or an idle share: noise only adds to it, so the least run is the variant's own."""
    return Sample.of(numbers[name], "min")


SINGLE_RUN_NOISE = 0.05
"""The least relative noise one run's step time carries here (two runs of the same work on a
quiet 2-core machine differ by a few percent): the noise a claim judged on one run per side
is given, since one run cannot measure its own."""


def one_run_ratio(ratio: float) -> Sample:
    """A ratio of two single runs, with ``SINGLE_RUN_NOISE`` on each side (twice it on the
    ratio): ``judge`` then says "holds" only for an effect beyond that noise."""
    return Sample(ratio, abs(ratio) * 2 * SINGLE_RUN_NOISE, (ratio,))
