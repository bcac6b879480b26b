"""Lesson 01's weak-scaling runs and its sentences: what its data-parallel runs showed.

``weak_scaling`` runs the same per-rank batch on 1, 2 and 4 ranks (4 ranks share a 2-core
laptop's cores on purpose; the lesson says so in its words). The lesson's prose states the
rules (weak scaling grows the step by the exposed all-reduce;
a forgotten ``DistributedSampler`` makes ranks load the same samples). These functions say
what *this* run measured, and where a measurement is far from the model they split it into
its parts so the student sees which part moved (compute that waited for a core, or
communication beyond what the wire needs). Torch-free: reads ``RunResult`` timelines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from labkit.base.devices import cpu_count, default_threads_per_rank
from labkit.base.progress import each
from labkit.lessons.machine import sharing_cores


def step_split_ms(result: Any, steps: Sequence[int] | None = None) -> dict[str, float]:
    """Per step (``steps``; default all but the first), mean over ranks: compute and exposed
    communication, ms."""
    tl = result.timeline.window(steps)
    count = max(len(tl.steps()), 1)
    ranks = tl.ranks or [0]
    compute = sum(tl.compute_ns(r) for r in ranks) / len(ranks)
    exposed = sum(tl.comm_ns(r) - tl.overlap_ns(r) for r in ranks) / len(ranks)
    return {"compute_ms": compute / count / 1e6, "exposed_ms": exposed / count / 1e6}


def weak_scaling(reuse: Mapping[int, Any] | None = None, sizes: Sequence[int] = (1, 2, 4),
                 **run_kwargs: Any) -> dict[int, Any]:
    """The same run (``run_kwargs``: strategy, steps, model, ...) on each world size, the
    batch per rank fixed; ``reuse`` holds runs already made (world size -> RunResult).

    Weak scaling gives every rank the same work and the same hardware, so every size runs
    with the torch threads a rank has when the most ranks that fit on the cores share them
    (``threads_per_rank``, unless given): on 2 cores the 1-rank run computes on one thread,
    as each of the 2 ranks does. Left to its default, the lone rank took both cores, and two
    OpenMP threads on a shared machine now and then waited on each other for whole time
    slices: its step once measured 191 ms against 6 ms, and the prediction built on it."""
    from labkit.api import run

    out = dict(reuse or {})
    run_kwargs.setdefault("progress", False)
    run_kwargs.setdefault("threads_per_rank",
                          default_threads_per_rank(min(max(sizes), cpu_count())))
    with sharing_cores():
        for n in each([n for n in sizes if n not in out], "weak scaling",
                      name=lambda n: f"{n} rank(s)"):
            out[n] = run(world_size=n, **run_kwargs)
    return {n: out[n] for n in sizes}


SLOW_CALL = 3.0
"""A call is "slow" when it took more than this many times what the fit predicts for its bytes."""
TYPICAL = 1.5
"""A median call within this many times its prediction: the step's typical call is the
benchmark's, and only its slow calls differ."""


def calls_text(run: Any, fit: Any, rank: int = 0) -> str:
    """What ``run``'s all-reduces cost call by call (``rank``'s, the steps after the first)
    beside ``fit`` (an ``AlphaBeta``) for each call's own bytes: their sum a step against the
    fit's, the median call's ratio, and the calls slower than ``SLOW_CALL`` x their
    prediction, with their sizes and their share of the excess. Empty without all-reduces."""
    from labkit.base.events import Op
    from labkit.visuals.axes import fmt_bytes

    tl = run.timeline.window()
    n, steps = tl.world_size, max(len(tl.steps()), 1)
    calls = [(e.dur_ns / 1e9, e.bytes or 0) for e in tl.select(rank=rank, op=Op.ALL_REDUCE)]
    if not calls or n < 2:
        return ""
    want = [fit.predict_mean(b, n) for _, b in calls]
    got_ms, want_ms = sum(t for t, _ in calls) * 1e3 / steps, sum(want) * 1e3 / steps
    stall = fit.stall_s * 1e3
    ratios = sorted(t / w for (t, _), w in zip(calls, want))
    slow = [(t, b, w) for (t, b), w in zip(calls, want) if t > SLOW_CALL * w]
    median = ratios[len(ratios) // 2]
    with_stall = f" and its mean stall ({stall:.2f} ms a call)" if stall > 0 else ""
    text = (f"  its {len(calls) // steps} all-reduces a step took {got_ms:.1f} ms against "
            f"{want_ms:.1f} ms that section 2's fit predicts for their bytes{with_stall}; "
            f"the median call took {median:.1f}x its prediction")
    if not slow:
        return text
    over = sum(t for t, _ in calls) - sum(want)
    share = sum(t - w for t, _, w in slow) / over if over > 0 else float("inf")
    sizes, took = sorted(b for _, b, _ in slow), sorted(t * 1e3 for t, _, _ in slow)
    at = (f"all at {fmt_bytes(sizes[0])}" if sizes[0] == sizes[-1] else
          f"at {fmt_bytes(sizes[0])} to {fmt_bytes(sizes[-1])}")
    return (text + f", and {len(slow)} of the {len(calls)} calls in {steps} steps took "
            f"{took[0]:.1f}-{took[-1]:.1f} ms, more than {SLOW_CALL:g}x theirs, {at}: time a "
            f"message's size does not explain (not bytes on the wire; most likely a waiting "
            f"thread being woken); "
            + (f"they are {share:.0%} of the excess. " if share < 1 else
               "they are all of the excess and more: the other calls ran under the fit. "
               if over > 0 else "the other calls ran under the fit and made up for them. ")
            + (
                ("The fit's line took each size's median call, and its stall term the "
                 "benchmark's calls on average: these calls stalled longer than those did."
                 if stall > 0 else "The fit took each size's median call, which leaves such "
                 "calls out; a step pays every call.") if median <= TYPICAL else
                f"Even the median call took {median:.1f}x: calls amid a step ran slower than "
                f"the benchmark's back-to-back calls"
                + (", its average stall included." if stall > 0 else
                   ", and its fit, from each size's median call, leaves the slowest out; a "
                   "step pays every call.")))


def scaling_text(runs: Mapping[int, Any], predicted: Mapping[int, float],
                 fit: Any = None) -> str:
    """Weak scaling, per world size: measured beside predicted, judged over the run's own
    steps (``dp_verdicts.scaling_verdict``), and where it does not hold, the same step
    replayed on dedicated cores, which part of the step differs and why (with ``fit``, the
    all-reduces call by call: ``calls_text``)."""
    from labkit.lessons.dp_verdicts import scaling_verdict, step_ms
    from labkit.lessons.replayed import again

    one = step_split_ms(runs[min(runs)])
    lines = []
    for n in sorted(runs):
        if n == min(runs):
            continue
        got, want = runs[n].step_time_s * 1e3, predicted[n] * 1e3
        part = step_split_ms(runs[n])
        line = f"{n} ranks: measured {got:.1f} ms, predicted {want:.1f} ms"
        verdict = scaling_verdict(runs, predicted, n)
        lines.append(verdict.sentence())
        if verdict.holds:
            continue
        lines.append("  " + again(f"the {n}-rank step (ms)", step_ms, [runs[n]], got, ".1f"))
        wire = want - predicted[min(runs)] * 1e3
        grown = part["compute_ms"] / max(one["compute_ms"], 1e-9)
        parts = (f"compute {part['compute_ms']:.1f} ms per rank "
                 f"({grown:.{1 if grown >= 0.1 else 2}f}x one rank's), "
                 f"exposed communication {part['exposed_ms']:.1f} ms (the fit predicts "
                 f"{wire:.1f}{', stalls included' if fit is not None and fit.stall_s else ''})")
        # below the prediction: the parts and the calls say which term the model overcharged
        lines.append(f"{line}: the prediction is above the run; {parts}; the 1-rank step it "
                     f"starts from computed {one['compute_ms']:.1f} ms" if got < want else
                     f"{line}; {parts}")
        if got > want and n > cpu_count():
            lines.append(f"  {n} ranks on {cpu_count()} cores take turns: a rank waiting for a "
                         f"core stretches its compute, and its peers wait for it inside the "
                         f"all-reduce -- waiting the alpha-beta model does not know")
        elif fit is not None:
            lines.append(calls_text(runs[n], fit))
    return "\n".join(lines)


BUCKET_CAPS = (0.25, 1.0, 4.0, 25.0)
"""The bucket sizes the lesson sweeps, MB: from many small all-reduces to one that waits for
the whole backward (the lesson's 512 x 4 MLP has about 3.2 MB of gradients)."""


def bucket_sweep(pool: Any, model: Any, caps: Sequence[float] = BUCKET_CAPS, repeats: int = 3,
                 steps: int = 4, show: bool = True) -> dict[float, list[Any]]:
    """``ddp-bucketed`` at every bucket size, alternated ``repeats`` times on ``pool``'s warm
    ranks (``labkit.lessons.measure``); a line per run when ``show``."""
    from functools import partial

    from labkit.lessons.measure import alternate

    def line(cap: float, round_: int, step_s: float) -> None:
        if show:
            print(f"  {cap:g} MB buckets: run {round_ + 1} of {repeats}, step "
                  f"{step_s * 1e3:.1f} ms", flush=True)

    _, results = alternate({c: partial(pool.run, strategy="ddp-bucketed", world_size=2,
                                       steps=steps, model=model, progress=False,
                                       options={"bucket_cap_mb": c}) for c in caps},
                           repeats, on_run=line, desc="bucket sweep")
    return results


def bucket_text(sweep: Mapping[float, Sequence[Any]]) -> str:
    """What the sweep showed, judged over the repeats: small buckets hide more of their
    communication under backward than one big bucket, and so take a shorter step."""
    from labkit.lessons.dp_verdicts import bucket_replays, bucket_verdicts

    caps = sorted(sweep)
    lines = ["  ".join(f"{c:g} MB: step {min(r.step_time_s for r in sweep[c]) * 1e3:.1f} ms, "
                       f"{max(r.metrics['overlap_fraction'] for r in sweep[c]):.0%} hidden"
                       for c in caps) + f"  (best of {len(sweep[caps[0]])} runs each)"]
    hidden, faster = bucket_verdicts(sweep)
    lines += [hidden.sentence(), faster.sentence()]
    lines += ["  " + line for line in bucket_replays(sweep, (hidden, faster))]
    if not faster.holds:
        lines.append(_why_not_shorter(sweep))
    return "\n".join(lines)


def _why_not_shorter(sweep: Mapping[float, Sequence[Any]]) -> str:
    """Why the small buckets' step was not the shorter one, read from the replay: where a
    core per rank still leaves it longer, the small buckets' all-reduces took more time a
    step than the one big bucket's, by more than hiding saved -- the numbers say so, and
    taking turns on the cores is not the whole story."""
    import statistics

    from labkit.base.events import Op
    from labkit.lessons.dp_verdicts import bucket_pair, replayed_step_ratio

    small, big = bucket_pair(sweep)
    again = replayed_step_ratio(sweep)
    turns = ("on two cores gloo's all-reduce threads and the backward take turns on the same "
             "cores, so what is hidden is not always saved")
    if again is None or again >= 1.0:
        return (f"{turns}: overlap pays when communication has hardware of its own (a free "
                f"core, a GPU's copy engine)")

    def comm(run: Any) -> tuple[float, float]:
        """Rank 0's all-reduces a step: how many, and their milliseconds added up."""
        tl = run.timeline.window()
        calls = tl.select(rank=0, op=Op.ALL_REDUCE)
        steps = max(len(tl.steps()), 1)
        return len(calls) / steps, sum(e.dur_ns for e in calls) / 1e6 / steps

    n_small = comm(sweep[small][0])[0]
    ms_small = statistics.median(comm(r)[1] for r in sweep[small])
    ms_big = statistics.median(comm(r)[1] for r in sweep[big])
    pays = ("Overlap pays when what it hides outweighs what the extra messages cost, and "
            "communication has hardware of its own (a free core, a GPU's copy engine)")
    still = (f"{turns}; and replayed with a core per rank (from this run's own message times) "
             f"the {small:g} MB step is still the longer ({again:.2f})")
    if ms_small <= ms_big:
        return f"{still}, so taking turns on the cores is not the whole story here. {pays}"
    return (f"{still}: its {n_small:.0f} all-reduces took {ms_small:.1f} ms a step, one "
            f"{big:g} MB bucket's {ms_big:.1f} ms, and what the small buckets hid did not make "
            f"up the difference (each message pays the wire's latency, and here they also "
            f"waited for the backward's core). {pays}")


def duplicates_text(cases: Mapping[str, Sequence[Mapping[str, Any]]],
                    report: Any) -> str:
    """One line per sampler case: what the ranks loaded, read from their records."""
    lines = []
    for label, results in cases.items():
        r = report(list(results))
        dup, first = r["duplicate_fraction"][0], r["epoch_repeats_first"]
        line = (f"{label}: {r['loaded_per_epoch'][0]} samples loaded in epoch 0, "
                f"{r['distinct_samples'][0]} distinct ({dup:.0%} loaded twice)")
        if first:
            line += ("; epoch 1 repeats epoch 0's order" if first[0]
                     else "; epoch 1 has a new order")
        lines.append(line)
    return "\n".join(lines)



def launched_in_backward(timeline: Any, step: int) -> dict[int, tuple[int, int]]:
    """Per rank, in step ``step`` (its STEP span): how many all-reduces were launched before
    that step's backward span ended, out of how many. Counted from the order of the trace's
    events (an async all-reduce's span starts at its launch), not from their durations."""
    from labkit.base.events import Op

    out = {}
    for r in timeline.ranks:
        mine = [e for e in timeline.events if e.rank == r]
        span = next(e for e in mine if e.op == Op.STEP and e.step == step)
        inside = [e for e in mine if span.start_ns <= e.start_ns <= span.end_ns]
        ends = [e.end_ns for e in inside if e.op == Op.BACKWARD]
        reduces = [e for e in inside if e.op == Op.ALL_REDUCE]
        if not ends:
            raise ValueError(f"step {step} of rank {r} has no backward span: trace it with "
                             f"`with ctx.span(Op.BACKWARD): loss.backward()`")
        out[r] = (sum(e.start_ns < max(ends) for e in reduces), len(reduces))
    return out


def overlap_text(timeline: Any, steps: Mapping[str, int]) -> str:
    """One line per variant (name -> its step): the all-reduces each rank launched while
    backward was still running, counted."""
    lines = []
    for name, step in steps.items():
        counts = launched_in_backward(timeline, step)
        per_rank = ", ".join(f"rank {r} {k} of {n}" for r, (k, n) in counts.items())
        early = all(k >= 1 for k, _ in counts.values())
        lines.append(f"{name}: all-reduces launched before backward ended: {per_rank} -- "
                     + ("the first bucket went on the wire while backward was still computing"
                        if early else "none started before backward ended: nothing could "
                        "overlap"))
    return "\n".join(lines)
