"""Lesson 07's measurements and sentences: resharding, the failed attempt's last steps, and
what a save costs beside Young's and Daly's checkpoint interval.

* ``reshard_check``: two real launches of ``labkit.train.checkpoint``'s rank functions,
  ``save_sharded`` on ``save_world`` ranks, then ``load_sharded`` on ``load_world`` ranks, and
  the loaded tensors compared with the model that was saved (torch's distributed checkpoint
  reshards on load).
* ``failure_text``: what the failed attempt's timeline shows, read from it (which rank
  stopped after which step, and which communication bar is the longest), so the sentence
  names the same bar as the figure.
* ``save_seconds`` / ``save_share`` / ``interval_text``: each save's duration from the runs'
  traces (the ``delta`` of ``labkit.theory.checkpointing``), the measured time spent saving
  per second of training, and the interval Young (1974) and Daly (2006) would choose with
  that ``delta``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labkit.analysis.claims import Sample
from labkit.api import launch
from labkit.base.events import Lane, Op
from labkit.config.run import ModelConfig
from labkit.theory.checkpointing import daly_interval, waste_fraction, young_interval
from labkit.train.checkpoint import load_sharded, save_sharded
from labkit.train.models import build_mlp

LLAMA3_MTBF_S = 54 * 24 * 3600 / 419
"""A failure every 3.1 hours: Llama 3's pre-training on 16k H100s saw 419 unexpected
interruptions in a 54-day snapshot (Dubey et al. 2024, "The Llama 3 Herd of Models", 3.3.4)."""


def reshard_check(root: str | Path, save_world: int = 4, load_world: int = 2, seed: int = 0,
                  timeout_s: float = 120.0) -> dict[str, Any]:
    """Save a sharded model at ``save_world`` ranks, load it at ``load_world``, compare.

    Two real launches. Returns each side's per-rank shard shapes and the max abs difference
    between the loaded tensors and the model that was saved (0.0 when resharding is exact).
    """
    saved = launch(save_sharded, save_world, str(root), 1, seed, timeout_s=timeout_s,
                   threads_per_rank=1, trace=False)
    loaded = launch(load_sharded, load_world, str(root), 1, timeout_s=timeout_s,
                    threads_per_rank=1, trace=False)
    expected = build_mlp(ModelConfig(), seed).state_dict()
    got = loaded.results[0]["full"]
    diffs = {k: float(abs(got[k] - expected[k].numpy()).max()) for k in expected}
    return {"saved_shapes": saved.results, "loaded_shapes": [r["shapes"] for r in loaded.results],
            "max_abs_diff": max(diffs.values()), "per_tensor": diffs}


def failure_text(timeline: Any, fault_rank: int, steps: Sequence[int]) -> str:
    """The failed attempt in words, read off its timeline: the last step each rank finished,
    the survivors' last communication, and the longest communication bar among ``steps``."""
    ranks = range(timeline.world_size)
    done = {r: max(timeline.finished_steps(r), default=-1) for r in ranks}
    lines = [f"rank {fault_rank} finished step {done[fault_rank]} and died as step "
             f"{done[fault_rank] + 1} began"]
    comm = [e for e in timeline.events if e.lane == Lane.COMM and e.op != Op.WAIT]
    for r in ranks:
        if r == fault_rank:
            continue
        last = max((e for e in comm if e.rank == r), key=lambda e: e.start_ns, default=None)
        if last is not None:
            lines.append(f"rank {r} finished step {done[r]}; its last {last.op.value} (step "
                         f"{last.step}) lasted {last.dur_ns / 1e6:.1f} ms, until gloo saw the "
                         f"connection close")
    shown = [e for e in comm if e.step in set(steps)]
    if shown:
        top = max(shown, key=lambda e: e.dur_ns)
        lines.append(f"the longest red bar in steps {min(steps)}-{max(steps)}: rank {top.rank}'s "
                     f"{top.op.value} in step {top.step}, {top.dur_ns / 1e6:.1f} ms")
    return "\n".join(lines)


def save_seconds(*timelines: Any) -> list[float]:
    """Each save's duration (seconds): its slowest rank's checkpoint span, since the save is
    committed only when every shard is on disk."""
    per_save: dict[tuple[int, int | None], float] = {}
    for n, tl in enumerate(timelines):
        for e in tl.events:
            if e.op == Op.CHECKPOINT and (e.name or "").startswith("save"):
                key = (n, e.step)
                per_save[key] = max(per_save.get(key, 0.0), e.dur_ns / 1e9)
    return [per_save[k] for k in sorted(per_save, key=lambda k: (k[0], k[1] or 0))]


def save_share(result: Any, rank: int = 0) -> float:
    """Seconds ``rank`` spent saving per second of training steps in ``result`` (measured)."""
    ev = [e for e in result.timeline.events if e.rank == rank]
    saving = sum(e.dur_ns for e in ev if e.op == Op.CHECKPOINT and (e.name or "").startswith("save"))
    training = sum(e.dur_ns for e in ev if e.op == Op.STEP)
    return saving / training if training else 0.0


def interval_text(saves_s: Sequence[float], step_s: float, every: int,
                  mtbf_s: float = LLAMA3_MTBF_S) -> str:
    """Young's and Daly's intervals for this run's save cost (median over its saves, with
    the spread) and the failure rate ``mtbf_s``; the lesson's own interval beside them."""
    delta = Sample.of(saves_s, "median")
    lo, hi = min(saves_s), max(saves_s)
    young, daly = young_interval(delta.value, mtbf_s), daly_interval(delta.value, mtbf_s)
    ours = every * step_s
    total = waste_fraction(ours, delta.value, mtbf_s)
    saving = delta.value / ours  # the saves alone: Young's first term
    part = ("almost all of it saving" if saving >= 0.9 * total else
            f"{saving / total:.0%} of it saving")
    return "\n".join([
        f"a save took {delta.value * 1e3:.0f} ms (median of {len(saves_s)} saves, from "
        f"{lo * 1e3:.0f} to {hi * 1e3:.0f} ms); a step {step_s * 1e3:.1f} ms",
        f"with a failure every {mtbf_s / 3600:.1f} h: Young's interval sqrt(2 delta M) = "
        f"{young:.1f} s (from {young_interval(lo, mtbf_s):.1f} to "
        f"{young_interval(hi, mtbf_s):.1f} s over the saves' spread), Daly's {daly:.1f} s "
        f"= about {daly / step_s:,.0f} steps of this run",
        f"the model's expected loss: {waste_fraction(daly, delta.value, mtbf_s):.2%} of the "
        f"training time at Daly's interval; saving every {every} steps ({ours * 1e3:.0f} ms) "
        f"costs {total:.0%}, {part}"])
