"""One-call helpers the lesson 03 notebook and the bench use (real runs, returned as data).

Defaults are sized for a 2-core laptop: width-1024 layers, so a stage's compute (a few ms
per microbatch) is well above the cost of moving an activation between ranks, and only a
few steps. Each helper returns ``labkit.run`` results; the figures live in
``labkit.visuals.pipeline``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from labkit.config import ModelConfig
from labkit.runner import RunResult, run

LESSON_MODEL = ModelConfig(width=1024, depth=8)


def run_pipeline(schedule: str = "1f1b", stages: int = 2, microbatches: int = 4, *,
                 virtual: int | None = None, steps: int = 3, batch_size: int = 64,
                 model: ModelConfig = LESSON_MODEL, layer_costs: tuple[int, ...] = (),
                 balance: str = "count", **run_kwargs: Any) -> RunResult:
    """Train the lesson model with one schedule on ``stages`` real ranks."""
    run_kwargs.setdefault("timeout_s", 120)
    run_kwargs.setdefault("progress", False)
    return run(strategy="pipeline", world_size=stages, steps=steps, batch_size=batch_size,
               model=model, options={"schedule": schedule, "stages": stages,
                                     "microbatches": microbatches, "virtual": virtual,
                                     "layer_costs": layer_costs, "balance": balance},
               **run_kwargs)


def bubble_sweep(stages: int = 2, microbatches: Iterable[int] = (2, 4, 8), *,
                 schedule: str = "gpipe", **kwargs: Any) -> dict[int, RunResult]:
    """One real run per microbatch count (same global batch, so only the split changes)."""
    return {m: run_pipeline(schedule, stages, m, **kwargs) for m in microbatches}


def balance_demo(layer_costs: tuple[int, ...] = (1, 1, 1, 1, 1, 1, 4, 4), stages: int = 2,
                 microbatches: int = 8, *, schedule: str = "1f1b", **kwargs: Any
                 ) -> dict[str, RunResult]:
    """The same uneven model split by layer count and by measured cost."""
    model = kwargs.pop("model", ModelConfig(width=1024, depth=len(layer_costs)))
    return {label: run_pipeline(schedule, stages, microbatches, model=model,
                                layer_costs=layer_costs, balance=balance, **kwargs)
            for label, balance in (("by layer count", "count"), ("by measured cost", "cost"))}


def bubble_row(result: RunResult) -> dict[str, Any]:
    """The bubble numbers of one run, predicted and measured (both share of total)."""
    m = result.metrics
    return {"schedule": m["schedule"], "p": m["stages"], "m": m["microbatches"],
            "v": m["virtual"], "predicted": m["bubble_fraction_predicted"],
            "measured": m["bubble_fraction"], "per rank": m["bubble_fraction_per_rank"],
            "peak acts": m["peak_activations"], "step ms": result.step_time_s * 1e3}
