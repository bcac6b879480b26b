"""The hybrid run's metrics from every rank's record, beside the predictions (torch-free).

Conventions: traffic in wire bytes per step (ring factors of nccl-tests; point-to-point
counts what was sent), summed over ALL ranks of the grid, per axis; memory is each rank's
model state (params, grads, optimizer) counted from the storages it keeps; the bubble is the
pipeline's idle share of total step time (``labkit.strategies.pipeline.metrics``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from labkit.base.grid import GROUP_AXES as AXES

_THEORY_OPTIMIZER = {"sgd": "sgd", "momentum": "momentum", "adam": "adam",
                     "lars": "momentum", "lamb": "adam"}
"""LARS keeps a momentum buffer (4 B/param), LAMB Adam's two moments (8 B/param)."""


def predicted_layout(config: Any, bounds: list[int], grid: dict[str, int],
                     records_view: Any) -> Any:
    """``labkit.theory.parallel_layout`` for this run's model, grid and pipeline settings."""
    from labkit.theory import parallel_layout
    from labkit.train.data.text import vocab_size_of

    m, r = config.model, records_view
    return parallel_layout(kind=m.kind, width=m.width, depth=m.depth, heads=m.heads,
                           seq_len=m.seq_len, vocab=vocab_size_of(m.vocab_size),
                           in_dim=m.in_dim, out_dim=m.out_dim, dp=grid["dp"], pp=grid["pp"],
                           tp=grid["tp"], cp=grid.get("cp", 1), microbatches=r.microbatches or 1,
                           batch_size=config.batch_size, zero_stage=r.zero_stage or 0,
                           optimizer=_THEORY_OPTIMIZER[config.optimizer], bounds=bounds,
                           sequence_parallel=bool(getattr(config.options, "sequence_parallel",
                                                          False)),
                           experts=getattr(config.options, "experts", 0),
                           ep=grid.get("ep", 1), top_k=getattr(config.options, "top_k", 1))


def summarize(records: Sequence[Any], config: Any) -> dict[str, Any]:
    from labkit.strategies.pipeline.metrics import bubble_summary
    from labkit.theory import bubble_fraction

    first = records[0]
    grid = {"cp": 1, "ep": 1, **(first.grid or {"dp": 1, "pp": 1, "tp": 1})}
    layout = predicted_layout(config, first.stage_bounds or [], grid, first)
    measured = {a: sum((r.axis_bytes or {}).get(a, 0.0) for r in records) for a in AXES}
    terms = ("params", "grads", "optimizer")
    out: dict[str, Any] = {
        "comm_bytes_per_axis": measured,
        "predicted_comm_bytes_per_axis": {a: layout.traffic.get(a, 0.0) for a in AXES},
        "comm_ratio_per_axis": {a: measured[a] / layout.traffic[a] if layout.traffic.get(a) else
                                (1.0 if measured[a] == 0 else float("inf")) for a in AXES},
        "per_rank_bytes": [r.model_state_bytes for r in records],
        "predicted_bytes": [{t: layout.memory_per_rank[r.pp_rank][t] for t in terms}
                            for r in records],
        "params_per_rank": [r.params_held for r in records],
        "predicted_params_per_rank": [layout.params_per_rank[r.pp_rank] for r in records],
    }
    out.update(layer_norm_bytes(records, config, layout.bounds, grid))
    out.update(expert_routing(records, config, grid, out))
    pp = grid.get("pp", 1)
    stage_ms = [[r.stage_ms for r in records if r.pp_rank == s and r.stage_ms is not None]
                for s in range(pp)]
    out["stage_time_ms"] = [sum(v) / len(v) if v else 0.0 for v in stage_ms]
    if pp > 1:
        out.update(bubble_summary([r.step_stats or [] for r in records]))
        out["bubble_fraction_predicted"] = bubble_fraction(pp, first.microbatches or 1,
                                                           first.schedule or "1f1b")
    else:
        out["bubble_fraction"] = 0.0
    if layout.notes:
        out["note"] = "; ".join(layout.notes)
    return out


def report_lines(m: dict[str, Any]) -> list[str]:
    """The 3D run's table for ``labkit run``: traffic per axis and memory per rank."""
    from labkit.analysis.report import mb, table

    if "comm_bytes_per_axis" not in m:
        return []
    grid = m.get("grid", {})
    axes = [a for a in AXES if a in ("dp", "pp", "tp") or grid.get(a, 1) > 1]
    shown = " x ".join(f"{a}{grid.get(a, 1)}" for a in axes)
    lines = [f"  grid          {shown}, "
             f"ZeRO-{m.get('zero_stage', 0)} on dp, {m.get('schedule')} x "
             f"{m.get('microbatches')} microbatches",
             "  traffic per step, all ranks (MB on the wire), measured vs "
             "labkit.theory.parallel_layout"]
    lines += table(["axis", "measured", "predicted", "ratio"],
                   [[a, mb(m["comm_bytes_per_axis"][a]), mb(m["predicted_comm_bytes_per_axis"][a]),
                     f"{m['comm_ratio_per_axis'][a]:.4f}"] for a in axes])
    lines.append("  model state per rank (MB), measured (predicted)")
    terms = ("params", "grads", "optimizer")
    lines += table(["rank", *terms],
                   [[str(r)] + [f"{mb(got[t])} ({mb(want[t])})" for t in terms]
                    for r, (got, want) in enumerate(zip(m["per_rank_bytes"],
                                                        m["predicted_bytes"]))])
    if grid.get("pp", 1) > 1:
        lines.append(f"  bubble        measured {m['bubble_fraction']:.3f}, predicted "
                     f"{m.get('bubble_fraction_predicted', float('nan')):.3f}")
    return lines


def layer_norm_bytes(records: Sequence[Any], config: Any, bounds: list[int],
                     grid: dict[str, int]) -> dict[str, Any]:
    """The LayerNorm regions' activation bytes per rank and microbatch, measured beside
    ``labkit.theory.layer_norm_activation_bytes`` (the GPT only)."""
    from labkit.theory import layer_norm_activation_bytes

    m = config.model
    if m.kind != "gpt" or any(r.ln_activation_bytes is None for r in records):
        return {}
    first = records[0]
    rows = config.batch_size // (first.microbatches or 1)
    sp = bool(getattr(config.options, "sequence_parallel", False))
    want = [layer_norm_activation_bytes(m.seq_len // grid.get("cp", 1), rows, m.width,
                                        tp=grid.get("tp", 1),
                                        layers=bounds[r.pp_rank + 1] - bounds[r.pp_rank],
                                        sequence_parallel=sp) for r in records]
    return {"ln_activation_bytes_per_rank": [r.ln_activation_bytes for r in records],
            "predicted_ln_activation_bytes_per_rank": want}


def expert_routing(records: Sequence[Any], config: Any, grid: dict[str, int],
                   out: dict[str, Any]) -> dict[str, Any]:
    """MoE runs: tokens per expert, dropped assignments and load imbalance (step 0, all
    ranks), and the ep axis's bytes predicted from the routing the ranks recorded
    (``labkit.theory.experts.expert_parallel_traffic``, the steady steps as measured)."""
    from labkit.theory.experts import expert_parallel_traffic, load_imbalance

    if any(r.moe_kept_per_step is None for r in records):
        return {}
    experts = config.options.experts
    routed = [sum(col) for col in zip(*(r.moe_tokens_per_expert for r in records))]
    res: dict[str, Any] = {"tokens_per_expert": routed,
                           "dropped_assignments": sum(r.moe_dropped or 0 for r in records),
                           "load_imbalance": load_imbalance(routed),
                           "aux_loss": [x for r in records for x in (r.moe_aux_loss or [])]}
    if grid.get("ep", 1) > 1:
        n = len(records[0].moe_kept_per_step)
        steady = range(1, n) if n > 1 else range(n)
        per_step = [expert_parallel_traffic([r.moe_kept_per_step[s] for r in records],
                                            config.model.width, experts,
                                            records[0].moe_calls_per_step[s]) for s in steady]
        want = statistics.median(per_step) if per_step else 0.0
        out["predicted_comm_bytes_per_axis"]["ep"] = want
        got = out["comm_bytes_per_axis"]["ep"]
        out["comm_ratio_per_axis"]["ep"] = got / want if want else float("inf")
    return res
