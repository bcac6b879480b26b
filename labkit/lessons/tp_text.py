"""Lesson 04's sentences: what this tensor-parallel run showed, beside Megatron's rules.

Megatron-LM (Shoeybi et al. 2019) splits a column-parallel linear and a row-parallel one so
that a layer pair needs one all-reduce forward (g) and one backward (f); the sharded model
computes the same function; each rank keeps 1/n of the split matrices; and the all-reduces
sit between dependent matmuls, so nothing hides them. Each rule here is read off the run
(its metrics and its timeline), with the numbers, and where the run disagrees the sentence
says why. Torch-free.
"""

from __future__ import annotations

from typing import Any

from labkit.base.events import Op
from labkit.lessons.machine import load_now, why_not
from labkit.theory.rounding import run_tolerance
from labkit.visuals.comm import rank_shares

SAME_FUNCTION = 1e-5
"""The largest difference from the unsharded model that is still float rounding (fp32)."""
HIDDEN = 0.15
"""Share of communication under compute above which TP's all-reduces did hide."""


def tp_text(tp: Any) -> str:
    """The lesson's claims about one ``tp`` run, each with what the run measured."""
    m = tp.metrics
    n = tp.config.world_size
    lines = []
    diffs = {k: m[k] for k in ("max_abs_diff_output", "max_abs_diff_loss",
                               "max_abs_diff_vs_reference")}
    bars = {k: SAME_FUNCTION for k in diffs}  # the trained weights: the lab's rounding
    bars["max_abs_diff_vs_reference"] = max(SAME_FUNCTION, run_tolerance(tp.config))
    worst = max(diffs, key=lambda k: diffs[k] / bars[k])
    if all(diffs[k] < bars[k] for k in diffs):
        lines.append(f"same function: every difference from the unsharded blocks is below "
                     f"{SAME_FUNCTION:g}, the trained weights' below rounding's "
                     f"{bars['max_abs_diff_vs_reference']:.0e} (largest {diffs[worst]:.1g}, "
                     f"{worst})")
    else:
        lines.append(f"NOT the same function: {worst} = {diffs[worst]:.2g} >= "
                     f"{bars[worst]:g}: report this run")
    share = m["params_per_rank"] / m["params_full"]
    lines.append(f"each rank keeps {m['params_per_rank']:,} of {m['params_full']:,} parameters "
                 f"({share:.1%}; 1/{n} = {1 / n:.1%} plus the replicated LayerNorms and "
                 f"row-parallel biases)")
    lines.append("bytes per layer: measured equals predicted exactly" if m["comm_bytes_match"]
                 else "bytes per layer: measured differs from predicted: report this run")
    hidden = m["overlap_fraction"]
    shares = rank_shares(tp.timeline)
    comm = sum(s["comm"] for s in shares) / len(shares)
    line = (f"{hidden:.0%} of the all-reduce time hid under compute; exposed all-reduces "
            f"took {comm:.0%} of each rank's step")
    if hidden < HIDDEN:
        lines.append(line + ": on the critical path, as the rule says")
    else:
        lines.append(line + ": more than the rule allows -- a rank waiting for a core inside "
                     "an all-reduce is counted as computing elsewhere; "
                     + why_not(load_now(), n))
    counts = (m.get("dtensor") or {}).get("comm_counts")
    if counts is not None:
        lines.append(f"DTensor's MLP issued {counts.get('all_reduce', 0)} all-reduces for one "
                     f"forward and backward (Megatron: 1 forward, g, and 1 backward, f)")
    return "\n".join(lines)


def allreduces_in_step(tp: Any, step: int, rank: int = 0) -> int:
    """How many all-reduces Megatron's f and g issued on ``rank`` in ``step`` of a ``tp`` run,
    counted from its timeline (the spans named like ``L0.mlp.f`` / ``L0.attn.g``; the gather
    of the weights at the end is not one of them)."""
    return sum(1 for e in tp.timeline.events
               if e.rank == rank and e.step == step and e.op == Op.ALL_REDUCE and e.name
               and e.name.endswith((".f", ".g")))
