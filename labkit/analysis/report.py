"""What ``labkit run`` prints: a short, readable summary per strategy, predicted beside measured.

``describe(result)`` writes, in order: the run line; the loss; where a step's time went
(compute, communication, overlap, idle); throughput (samples, tokens per second and MFU);
then the strategy's own table, from its metrics record's ``report_lines`` (ZeRO's bytes per
rank, the pipeline's bubble beside its plan, DDP's overlap and bytes, a 3D run's traffic per
axis); then every remaining number, so nothing measured is hidden (``--json`` has it all).
Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

SHOWN = {"compute_s", "comm_s", "overlap_fraction", "idle_fraction", "step_time_s", "note",
         "samples_per_s", "tokens_per_s", "mfu", "model_flops_per_s", "peak_flops_per_s"}


def number(v: Any) -> str:
    """Floats to 4 significant digits (lists element by element); anything else as is."""
    if isinstance(v, bool) or not isinstance(v, (float, list)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(number(x) for x in v) + "]"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"


def mb(v: float) -> str:
    return f"{v / 1e6:.3f}"


def table(header: list[str], rows: Iterable[list[Any]], indent: str = "    ") -> list[str]:
    """Right-aligned columns."""
    cells = [header] + [[c if isinstance(c, str) else number(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [indent + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]


def describe(result: Any) -> str:
    """The readable summary of a run (see the module docstring)."""
    m = result.metrics
    lines = [repr(result)]
    if result.losses:
        lines.append(f"  loss          {result.losses[0]:.4f} -> {result.losses[-1]:.4f}")
    if "compute_s" in m:
        lines.append(f"  per rank      compute {m['compute_s']:.4g} s, comm {m['comm_s']:.4g} s, "
                     f"overlap {m['overlap_fraction']:.2f}, idle {m['idle_fraction']:.2f}")
    rate = [f"{m[k]:,.0f} {k.split('_')[0]}/s" for k in ("samples_per_s", "tokens_per_s")
            if k in m]
    if "mfu" in m:
        rate.append(f"MFU {m['mfu']:.3f} of {m['peak_flops_per_s'] / 1e9:.0f} GFLOP/s")
    if rate:
        lines.append("  throughput    " + ", ".join(rate))
    record = next((o.record for o in getattr(result, "outputs", ())
                   if getattr(o, "record", None) is not None),
                  None)
    if record is not None:
        lines += record.report_lines(m)
    shown = SHOWN | set(getattr(record, "REPORTED", ()))
    for key, v in m.items():
        if key in shown:
            continue
        if isinstance(v, (int, float, str)) or (
                isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
            lines.append(f"  {key:<13} {number(v)}")
    link = m.get("link")
    if isinstance(link, dict) and link.get("measured_bps"):  # runs across emulated nodes
        shaped = f"{link['rate_bps'] / 1e6:g} Mbit/s" if link.get("rate_bps") else "unshaped"
        lines.append(f"  link          {link.get('spec') or 'unshaped'}: {shaped}, measured "
                     f"{link['measured_bps'] / 1e6:.1f} Mbit/s, "
                     f"{link['measured_latency_s'] * 1e6:.0f} us one-way")
    if result.trace_path:
        lines.append(f"  trace         {result.trace_path}  (open in ui.perfetto.dev)")
    if result.params_sha256:
        lines.append(f"  params_sha256 {result.params_sha256}")
    if isinstance(m.get("note"), str):
        lines.append(f"  note: {m['note']}")
    for skipped in m.get("checkpoint_fallback") or []:
        lines.append(f"  note: skipped checkpoint {skipped['checkpoint']}: {skipped['file']} "
                     f"failed the {skipped['check']} check ({skipped['detail']}); resumed from "
                     f"step {skipped.get('resumed_from_step')}")
    for adapted in m.get("resume_adapted") or []:
        lines.append(f"  note: resumed across a change: {adapted}")
    for moved in m.get("checkpoints_moved_aside") or []:
        lines.append(f"  note: a damaged checkpoint directory was renamed {moved}")
    bad = next((i for i, loss in enumerate(result.losses) if not math.isfinite(loss)), None)
    if bad is not None:
        lines.append(f"  note: the loss is {result.losses[bad]} from step {bad} on: training "
                     f"diverged; try a smaller learning rate (lr = {result.config.lr})")
    return "\n".join(lines)
