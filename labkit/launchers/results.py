"""What every launcher returns: ``RunResult`` (a strategy's run) and ``LaunchResult`` (a
function run on N ranks), and ``collect``, which turns the ranks' reports into one.

The supervisor, the warm pool, torchrun's rank 0 and Ray Train all end here, with the same
``Job`` they started from, so the same seed gives the same result whoever started the ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.analysis.throughput import throughput
from labkit.analysis.timeline import Timeline
from labkit.config.metrics import combine_records
from labkit.config.run import RunConfig
from labkit.rank.context import RankOutput
from labkit.rank.job import RankReport, RunJob
from labkit.rank.pinning import run_meta


@dataclass
class RunResult:
    """The outcome of one ``labkit.run``."""

    config: RunConfig
    backend: str
    timeline: Timeline
    losses: list[float]
    """Per step, the mean over ranks that computed a loss."""
    metrics: dict[str, Any]
    wall_s: float
    """Seconds from the call to the last rank reaped (includes process start-up)."""
    params_sha256: str | None
    outputs: list[RankOutput] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    """What each rank printed (stdout and stderr), by rank."""
    trace_path: str | None = None

    @property
    def step_time_s(self) -> float:
        """Median step time (first step skipped: it pays for warm-up)."""
        return self.timeline.median_step_s()

    def save_trace(self, path: str | Path) -> str:
        """Write the Chrome / Perfetto trace (open it at ui.perfetto.dev or chrome://tracing)."""
        self.timeline.to_chrome(path)
        self.trace_path = str(path)
        return self.trace_path

    def to_json(self) -> dict[str, Any]:
        return {"strategy": self.config.strategy, "world_size": self.config.world_size,
                "backend": self.backend, "steps": self.config.steps,
                "wall_s": round(self.wall_s, 4), "step_time_s": self.step_time_s,
                "losses": self.losses, "metrics": self.metrics, "trace": self.trace_path,
                "params_sha256": self.params_sha256, "config": self.config.to_json()}

    def __repr__(self) -> str:
        last = f"{self.losses[-1]:.4f}" if self.losses else "n/a"
        return (f"RunResult(strategy={self.config.strategy!r}, world_size="
                f"{self.config.world_size}, backend={self.backend!r}, steps="
                f"{self.config.steps}, final_loss={last}, step_time={self.step_time_s*1e3:.2f} "
                f"ms, wall={self.wall_s:.2f} s)")


@dataclass
class LaunchResult:
    """What ``launch`` returns: every rank's return value and the merged timeline."""

    results: list[Any]
    timeline: Timeline
    wall_s: float
    logs: list[str] = field(default_factory=list)
    """What each rank printed (stdout and stderr), by rank."""


def merged_events(reports: list[RankReport]) -> list[Any]:
    """Every rank's events on the run's one clock, in start order."""
    return sorted((e for r in reports for e in r.events), key=lambda e: (e.start_ns, e.rank))


def collect(job: RunJob, reports: list[RankReport], wall: float) -> RunResult:
    """Every rank's report -> one ``RunResult``: the merged timeline, the losses, the
    strategy's metrics combined from each rank's typed record, and throughput. Reads the
    backend and the grid from the job (resolved once, when it was built)."""
    config, backend, grid = job.config, job.backend, job.grid
    outputs: list[RankOutput] = [r.output for r in reports]
    hosts = sorted({r.host for r in reports})
    timeline = Timeline(merged_events(reports), config.world_size,
                        {"config": config.to_json(), "backend": backend, "hosts": hosts,
                         "grid": grid.as_dict(), "pinning": _pinning(reports)})
    per_step = [o.losses for o in outputs if o.losses]
    losses = [statistics.fmean(vals) for vals in zip(*per_step)] if per_step else []
    metrics: dict[str, Any] = dict(timeline.summary()) if config.trace else {}
    for o in outputs:  # free-form metrics: rank 0's view wins on clashes
        for k, v in o.metrics.items():
            metrics.setdefault(k, v)
    for k, v in outputs[0].metrics.items():
        metrics[k] = v
    metrics.update(combine_records([o.record for o in outputs], config))
    for o in outputs:  # each rank's own view stays readable as outputs[r].metrics
        o.metrics = o.all_metrics()
    step_time = timeline.median_step_s() if config.trace else metrics.get("step_wall_s", 0.0)
    metrics.update(throughput(metrics, step_time, config, backend, job.threads))
    sha = next((o.params_sha256 for o in outputs if o.params_sha256), None)
    return RunResult(config=config, backend=backend, timeline=timeline, losses=losses,
                     metrics=metrics, wall_s=wall, params_sha256=sha, outputs=outputs)


def launch_result(reports: list[RankReport], world_size: int, wall: float, logs: list[str]
                  ) -> LaunchResult:
    """Every rank's return value, in rank order, with the merged timeline."""
    return LaunchResult([r.output for r in reports],
                        Timeline(merged_events(reports), world_size,
                                 {"pinning": _pinning(reports)}), wall, logs)


def _pinning(reports: list[RankReport]) -> dict[str, Any]:
    """Each rank's cores, in rank order (``labkit.rank.pinning.run_meta``)."""
    ordered = sorted(reports, key=lambda r: r.rank)
    return run_meta([r.pinning for r in ordered])
