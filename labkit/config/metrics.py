"""Typed metrics: each rank fills a small record; the runner combines every rank's record.

A strategy's rank code measures what it can see from where it stands (its own bytes, its
own pipeline spans, its own share of the model) into a dataclass deriving from
``RankMetrics``, and returns it as ``RankOutput.record``. Nothing is packed into
anonymous float lists and all-gathered: after the run, in the parent process, the runner
(or the torchrun worker's rank 0, or the Ray launcher) hands the records of ALL ranks to
``type(record).combine(records, config)``, which returns the run's metrics dict
(``RunResult.metrics``, the JSON contract of ``labkit run --json``).

Records are plain dataclasses in torch-free modules, so the supervisor can unpickle and
combine them without importing torch.

Throughput and MFU are computed from the combined metrics by
``labkit.analysis.throughput``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass
class RankMetrics:
    """What every training run reports; strategies add their own fields in a subclass.

    Fields left at None are not reported. ``combine`` (parent side) merges the ranks:
    by default rank 0's values, with per-rank-only fields filled from the first rank that
    has them and ``max_abs_diff_*`` as the worst rank.
    """

    num_params: int | None = None
    """Parameters of the whole model (not this rank's share)."""
    samples_per_step: int | None = None
    """Samples in one optimizer step, all ranks together (the global batch)."""
    tokens_per_step: int | None = None
    """Tokens in one optimizer step (language models only)."""
    flops_per_step: float | None = None
    """Model FLOPs of one optimizer step, all ranks together (forward + backward)."""
    max_abs_diff_vs_reference: float | None = None
    """Largest |w - w_reference| this rank could check against one process."""
    accuracy: float | None = None
    """Share of held-out samples the final model classifies correctly (digits)."""
    checkpoints_saved: list[int] | None = None
    resumed_from_step: int | None = None
    checkpoint_fallback: list[dict[str, Any]] | None = None
    """Newer checkpoints a resume skipped because a file failed its check (which, why)."""
    checkpoints_moved_aside: list[str] | None = None
    """Step directories that were not committed checkpoints, renamed ``*.corrupt`` by a save."""
    resume_adapted: list[str] | None = None
    """What a resume adapted to this run (another world size or grid: resharded), or that the
    checkpoint recorded no run to check."""
    step_seconds: list[float] | None = None
    """Wall seconds of each step on this rank (measured with or without the tracer)."""
    step_cpu_seconds: list[float] | None = None
    """CPU seconds this rank's process spent in each step, all its threads (``process_time``):
    what the step cost, without the time it waited for a core on a busy machine."""

    REPORTED: ClassVar[tuple[str, ...]] = ()
    """Run metrics ``report_lines`` already shows (``labkit run`` prints the rest plainly)."""

    @classmethod
    def report_lines(cls, metrics: dict[str, Any]) -> list[str]:
        """The strategy's own table for ``labkit run`` (``labkit.analysis.report``); none by default."""
        return []

    def as_dict(self) -> dict[str, Any]:
        """This rank's fields that were measured (None left out)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def combine(cls, records: Sequence[RankMetrics], config: Any) -> dict[str, Any]:
        """The run's metrics from every rank's record (rank order)."""
        out: dict[str, Any] = {}
        for rec in records[1:]:
            out.update(rec.as_dict())
        out.update(records[0].as_dict())
        for name, key in (("step_seconds", "step_wall_s"), ("step_cpu_seconds", "step_cpu_s")):
            out.pop(name, None)
            times = [getattr(r, name) for r in records if getattr(r, name)]
            if times:  # a step ends when its slowest rank does; the first warms up
                per_step = [max(v) for v in zip(*times)]
                steady = sorted(per_step[1:] or per_step)
                out[key] = steady[len(steady) // 2]
        diffs = {k for rec in records for k in rec.as_dict() if k.startswith("max_abs_diff")}
        for key in diffs:
            out[key] = max(float(getattr(rec, key)) for rec in records
                           if getattr(rec, key, None) is not None)
        return out


def combine_records(records: Sequence[Any], config: Any) -> dict[str, Any]:
    """``combine`` of the records' class, or {} when no rank returned a record."""
    present = [r for r in records if r is not None]
    if not present:
        return {}
    return dict(type(present[0]).combine(present, config))
