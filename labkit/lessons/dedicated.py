"""The dedicated-core replay in a lesson: when a timed verdict is not "holds", the lesson sets
the measured run beside the same run re-timed as if every rank had a core of its own and the
wire were the alpha-beta fitted on this machine (``labkit.analysis.replay``, issue 32).

A student on a busy laptop then sees two things apart: what this algorithm does on dedicated
hardware (the replay: a model built from this run's own CPU times and typical messages, and
labelled so) and what the machine's load did to it (the measurement). ``machine_wire`` fits
an alpha-beta wire once per kernel from a short run of the built-in all-reduce, for a replay
that should use a benchmark's wire instead of the run's own; ``replay_text`` says
the two step times (and the two bubbles, for a pipeline) in one sentence, with where the
measured ranks ran (pinned one per core, or why not: ``labkit.rank.pinning``);
``labkit.visuals.replay.plot_replay`` draws both timelines on one time scale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from labkit.analysis.replay import MODEL_LABEL, Replay, ReplayError, replay
from labkit.theory.comm import AlphaBeta

_WIRES: dict[int, AlphaBeta] = {}
TRIES = 3
"""Benchmarks ``fitted_bench`` runs before it says no line can be fitted."""
SIZES = ("4KB", "256KB", "4MB")
"""The all-reduce sizes a wire is fitted from: three decades of message."""


def fitted_bench(run: Callable[..., Any], impl: str = "builtin", *, world_size: int = 2,
                 sizes: Sequence[str] = SIZES, iters: int = 8, tries: int = TRIES,
                 say: Callable[[str], None] | None = None) -> Any:
    """An ``allreduce-bench`` of ``impl`` (``run``: ``labkit.run`` or a pool's) whose times
    grow with the message size, so that its ``metrics["alpha_beta"]`` holds a fitted line.
    Each size is the median of ``iters`` calls; on a busy machine one stalled small call can
    still outlast a big one, and no line fits: the bench then runs again with twice the
    calls, ``tries`` runs at most, and ``say`` (``print`` in a lesson) hears why. After the
    last try the line is fitted to each size's fastest call instead (the bench's
    ``alpha_beta_fastest``; ``alpha_beta["statistic"]`` says so): beside two CPU hogs the
    4 KB median stalled past the 4 MB one in all three tries, and Run All stopped here.
    Raises ``LabError`` with the last times when not even those fit."""
    from labkit.base.errors import LabError

    calls = iters
    tries = max(tries, 1)
    for k in range(tries):
        bench = run(strategy="allreduce-bench", world_size=world_size, progress=False,
                    options={"impl": impl, "sizes": list(sizes), "iters": calls})
        if bench.metrics["alpha_beta"] is not None:
            return bench
        times = [round(r["time_s"] * 1e3, 2) for r in bench.metrics["results"]]
        if say is not None and k + 1 < tries:
            say(f"{impl}: the times did not grow with the message size ({sizes[0]} to "
                f"{sizes[-1]}: {times} ms; most likely a call stalled on a busy machine), so no "
                f"alpha-beta line fits them: measured again with {2 * calls} calls a size")
        calls *= 2
    fastest = bench.metrics.get("alpha_beta_fastest")
    if fastest is not None:  # a stall only lengthens a call: the fastest calls hold the wire
        if say is not None:
            fast = [round(r["fastest_s"] * 1e3, 2) for r in bench.metrics["results"]]
            say(f"{impl}: in {tries} tries the median calls never grew with the message size "
                f"(last: {times} ms), so the line is fitted to each size's fastest call "
                f"({fast} ms): a stall only lengthens a call, and the fastest is the least "
                f"stalled")
        bench.metrics["alpha_beta"] = {**fastest, "statistic": "fastest call"}
        return bench
    raise LabError(f"this machine's {impl} all-reduce times did not grow with the message "
                   f"size in {tries} tries (last, {sizes[0]} to {sizes[-1]}: {times} ms), so "
                   f"no alpha-beta line can be fitted: the machine is too busy to measure it; "
                   f"close other programs and run the cell again")


def machine_wire(world_size: int = 2, runner: Any = None) -> AlphaBeta:
    """This machine's all-reduce as alpha-beta, fitted once per kernel (4 KB to 4 MB, the
    built-in all-reduce, a couple of seconds: ``fitted_bench``). ``runner``: a
    ``labkit.Pool`` to reuse."""
    if world_size not in _WIRES:
        import labkit

        run = runner.run if runner is not None else labkit.run
        ab = fitted_bench(run, "builtin", world_size=world_size).metrics["alpha_beta"]
        _WIRES[world_size] = AlphaBeta.from_bench(ab, stalls=False)
    return _WIRES[world_size]


def dedicated(result: Any, wire: AlphaBeta | None = None) -> Replay | None:
    """``result``'s timeline replayed on dedicated cores (None where it cannot be: a trace
    without the members of a collective, or a run on a GPU, whose spans carry no CPU time).
    Messages cost what the same message took in the run's median step, or ``wire``."""
    timeline = getattr(result, "timeline", result)
    if not any(e.cpu_ns is not None for e in timeline):
        return None
    try:
        return replay(timeline, wire)
    except ReplayError:
        return None


def replay_text(result: Any, rep: Replay | None, *, what: str = "the step") -> str:
    """One sentence: the measured step beside the replayed one (and the bubble, when the run
    reports one), labelled as a model, or why there is no replay."""
    timeline = getattr(result, "timeline", result)
    if rep is None:
        return ("no dedicated-core replay of this run: its trace has no CPU times (a GPU run) "
                "or a collective whose members it does not name")
    measured, modelled = timeline.median_step_s(), rep.median_step_s()
    text = (f"{what}, {MODEL_LABEL}: {modelled * 1e3:.1f} ms, where this machine measured "
            f"{measured * 1e3:.1f} ms")
    if measured > 0 and modelled > 0:
        text += f" ({measured / modelled:.2f}x the replay)"
    pinning = timeline.meta.get("pinning")
    if isinstance(pinning, dict) and pinning.get("reason"):  # where the measured ranks ran
        text += f" (measured with ranks {pinning['reason']})"
    metrics = getattr(result, "metrics", {})
    if "schedule" in metrics and "bubble_fraction" in metrics:  # a pipeline: its own measure
        from labkit.strategies.pipeline.metrics import timeline_bubble

        again = timeline_bubble(rep.timeline)["bubble_fraction"]
        text += f"; bubble {again:.2f} replayed, {metrics['bubble_fraction']:.2f} measured"
    return text


MISSED = ("contradicted by this run", "inconclusive on this machine")
"""The words of a verdict that did not hold (``labkit.analysis.claims.Verdict.sentence``)."""


SHOWN: list[str] = []
"""What this kernel's ``replay_if_missed`` replayed (its ``what``), for the lessons' checks."""


def missed(text: str) -> bool:
    """Whether any verdict in a lesson's printed ``text`` is not "holds"."""
    return any(word in text for word in MISSED)


def replay_if_missed(result: Any, verdicts: str, wire: AlphaBeta | None = None, *,
                     what: str = "the step") -> Any:
    """Where ``verdicts`` (the sentences a cell printed) hold a verdict that is not "holds":
    print the replay's sentence and return the measured and replayed timelines as one figure,
    each at its median step, the step whose time the sentence quotes
    (``labkit.visuals.replay.plot_replay``); else say that every verdict held and return None
    (a notebook shows nothing for None)."""
    if not missed(verdicts):
        # names what it judged: a lesson's earlier cells may have printed verdicts that
        # missed (each drew its own replay), and "every verdict above" read as all of them
        print(f"{what.split(':')[0]}: each verdict printed just above held, so no replay is "
              "drawn for it")
        return None
    rep = dedicated(result, wire)
    print(replay_text(result, rep, what=what))
    SHOWN.append(what)
    if rep is None:
        return None
    from labkit.visuals.replay import plot_replay

    return plot_replay(result, rep)

