"""One-call helpers the lesson 03 notebook and the bench use (real runs, returned as data).

Defaults are sized for the notebook on a 2-core laptop: width-1024 layers, batch 64, a few
steps, so every run takes seconds. At that size an action lasts a few ms and fixed costs
(Python, each message's ~0.6 ms handoff) show in the measured bubble; ``bubble_breakdown``
says how much of it is uneven compute and how much is communication. ``bench/bench_pipeline.py``
uses batch 1024 and 16 layers, where the measured bubble lands within 0.02 of the formula.
Each helper returns ``labkit.run`` results; the figures live in ``labkit.visuals.pipeline``.

``torch_twin`` runs labkit's GPipe or 1F1B beside ``torch.distributed.pipelining``'s twin on
the same GPT stages, seed and microbatches and returns how far the weights differ
(``labkit.strategies.pipeline.torch_schedules``).

The lesson's mechanism cell (a 1F1B loop written on the page) runs on ranks of
``labkit.launch``: ``page_stage`` gives each rank its stage of a small seeded MLP and a batch,
``labkits_step`` runs the same plan on an equal stage with labkit's own executor, so the two
steps' losses, activation counts and gradients can be compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from labkit.api import run
from labkit.base.errors import ConfigError
from labkit.base.progress import each
from labkit.base.validate import is_int
from labkit.config.run import ModelConfig, RunConfig
from labkit.launchers.results import RunResult
from labkit.lessons.pipeline_text import (
    least,  # noqa: F401 -- the notebook imports it from here
    replayed,
)
from labkit.schedules import Plan, validate_plan
from labkit.strategies.pipeline import PipelineOptions, orders_text, pipeline_model

LESSON_MODEL = pipeline_model(1024, 8)
TIMED_BATCH = 512
"""The batch of the lesson's timed claims (``repeat_pipeline``): 64 rows per microbatch at
m = 8. At batch 64 (8 rows) fixed per-action costs put m = 8's bubble at 0.18 against the
formula's 0.11 on a quiet 2-core machine; at 512 it landed at 0.14, inside the 0.05 margin,
and 1F1B's backward splits into I and W of about equal halves (measured 12 / 16 ms). Five
quiet runs later (2026-11-29) the least of three repeats read 0.14-0.17: on the margin's edge,
so the notebook check lets m = 8 miss quiet (docs/benchmarks.md, "Quiet is not steady")."""


def run_pipeline(schedule: str = "1f1b", stages: int = 2, microbatches: int = 4, *,
                 virtual: int | None = None, steps: int = 3, batch_size: int = 64,
                 model: ModelConfig = LESSON_MODEL, layer_costs: tuple[int, ...] = (),
                 balance: str = "count", runner: Any = None, **run_kwargs: Any) -> RunResult:
    """Train the lesson model with one schedule on ``stages`` real ranks (fresh ones, or
    ``runner``'s: a ``labkit.Pool`` of ``stages`` warm ranks). One run shows its own bar
    (``progress``, as ``labkit.run``); the lesson's sweeps pass ``progress=False`` and count
    their runs on one bar instead."""
    run_kwargs.setdefault("timeout_s", 120)
    start = run if runner is None else runner.run
    return start(strategy="pipeline", world_size=stages, steps=steps, batch_size=batch_size,
               model=model, options={"schedule": schedule, "stages": stages,
                                     "microbatches": microbatches, "virtual": virtual,
                                     "layer_costs": layer_costs, "balance": balance},
               **run_kwargs)


def warm_ranks(stages: int) -> Any:
    """The kernel's pool of ``stages`` warm ranks (``labkit.pool``), which the lesson's
    repeats run on: each run then costs its steps, not a start-up. Measured quiet
    (GPipe, m = 8, batch 512, three runs each, in one sitting): a fresh run 2.45-2.59 s
    after the first, steps 0.46-0.73 s, bubble 0.19-0.25; on warm ranks 1.65-1.71 s after
    the first (2.40 s, which starts them), steps 0.42-0.64 s, bubble 0.15-0.20."""
    from labkit.launchers.pool import pool

    return pool(stages)


def repeat_pipeline(variants: Mapping[Any, Mapping[str, Any]], repeats: int = 3,
                    show: bool = True, **common: Any) -> dict[Any, list[RunResult]]:
    """Every variant (``run_pipeline``'s keyword arguments, over ``common``) run alternated
    ``repeats`` times (``labkit.lessons.measure.alternate``): a busy moment hits every
    variant alike, and the sentences judge the repeats, never one run. ``show`` prints a
    line per run (a lesson's progress). The runs go to ``warm_ranks`` unless ``common``
    names a ``runner`` (or the variants differ in ``stages``). Returns each variant's runs,
    in order."""
    from labkit.lessons.measure import alternate

    def line(name: Any, round_: int, bubble: float) -> None:
        if show:  # a variant keyed by a number is named by its settings ("microbatches=4")
            said = name if isinstance(name, str) else ", ".join(
                f"{k}={v}" for k, v in variants[name].items() if k != "schedule") or name
            print(f"  {said}: run {round_ + 1} of {repeats}, bubble {bubble:.2f}", flush=True)

    common.setdefault("batch_size", TIMED_BATCH)
    common.setdefault("progress", False)  # alternate's bar counts the runs
    stages = {kw.get("stages", common.get("stages", 2)) for kw in variants.values()}
    if "runner" not in common and len(stages) == 1:  # one pool holds one world size
        common["runner"] = warm_ranks(stages.pop())
    _, results = alternate({name: partial(run_pipeline, **{**common, **kw})
                            for name, kw in variants.items()}, repeats,
                           measure=lambda r: r.metrics["bubble_fraction"], on_run=line,
                           desc="pipeline repeats")
    return results


def balance_demo(layer_costs: tuple[int, ...] = (1, 1, 1, 1, 1, 1, 4, 4), stages: int = 2,
                 microbatches: int = 8, *, schedule: str = "1f1b", only: str | None = None,
                 **kwargs: Any) -> Any:
    """The same uneven model split by layer count and by measured cost, at ``TIMED_BATCH``
    (64 rows per microbatch at m = 8): at 8 rows a heavy block timed alone read about 8x a
    light one instead of 4x (weights streamed, not computed), so the cost split moved the
    imbalance to the other stage ([7, 1] layers) instead of evening it out ([6, 2]).
    ``only``: one split's run (its label), not the dict of both."""
    model = kwargs.pop("model", pipeline_model(1024, len(layer_costs)))
    kwargs.setdefault("batch_size", TIMED_BATCH)
    if only is None:
        kwargs.setdefault("progress", False)  # the bar over both splits counts them
    splits = [(k, v) for k, v in (("by layer count", "count"), ("by measured cost", "cost"))
              if only is None or k == only]
    out = {label: run_pipeline(schedule, stages, microbatches, model=model,
                               layer_costs=layer_costs, balance=balance, **kwargs)
           for label, balance in (splits if only else each(splits, "pipeline balance",
                                                            name=lambda v: v[0]))}
    return out[only] if only else out


def balance_repeats(layer_costs: tuple[int, ...] = (1, 1, 1, 1, 1, 1, 4, 4), stages: int = 2,
                    microbatches: int = 8, repeats: int = 3, **kwargs: Any
                    ) -> dict[str, list[RunResult]]:
    """``balance_demo``'s two splits alternated ``repeats`` times (``labkit.lessons.measure``:
    a busy moment hits both splits alike) on ``warm_ranks`` (unless ``kwargs`` names a
    ``runner``), every repeat kept, by label."""
    from labkit.lessons.measure import alternate

    if "runner" not in kwargs:
        kwargs["runner"] = warm_ranks(stages)
    kwargs.setdefault("progress", False)  # alternate's bar counts the runs
    _, runs = alternate({label: partial(balance_demo, layer_costs, stages, microbatches,
                                        only=label, **kwargs)
                         for label in ("by layer count", "by measured cost")},
                        repeats, measure=lambda r: r.step_time_s, desc="pipeline balance")
    return runs


def median_run(runs: Sequence[RunResult]) -> RunResult:
    """The repeat whose slowest stage is the median of the repeats': the one a table and
    figure show beside the verdict."""
    ranked = sorted(runs, key=lambda r: max(r.metrics["stage_time_ms"]))
    return ranked[(len(ranked) - 1) // 2]


def bubble_breakdown(result: RunResult, plan: Any = None) -> dict[str, float]:
    """Where a run's bubble came from, all as shares of total step time.

    ``predicted``: the formula (equal costs, free messages). ``replayed``: the plan re-timed
    with the CPU time your actions really cost (each rank on a core of its own), messages
    still free. ``measured``: your run. ``replayed - predicted`` is uneven compute; ``waiting
    for a core`` is the same replay with the actions' wall times minus the CPU-time replay
    (other programs and ranks holding the cores; below zero when the waits fell on the
    lighter stage and evened the stages out); ``communication`` is the rest (messages,
    and the per-message overhead of Python and gloo). The three add up to ``measured -
    predicted``. ``plan`` defaults to the schedule the run used; pass it for a hand-written
    plan.
    """
    m = result.metrics
    if plan is None and m["schedule"] == "custom":
        raise ConfigError("this run used a hand-written plan (schedule 'custom'): pass the "
                          "same Plan as plan=...; e.g. bubble_breakdown(result, plan=my_plan)")
    replay = replayed(result, plan)
    walls = replayed(result, plan, dedicated=False)
    return {"predicted": m["bubble_fraction_predicted"], "replayed": replay,
            "measured": m["bubble_fraction"],
            "uneven compute": replay - m["bubble_fraction_predicted"],
            "waiting for a core": walls - replay, "communication": m["bubble_fraction"] - walls}


def bubble_row(result: RunResult) -> dict[str, Any]:
    """The bubble numbers of one run, predicted and measured (both share of total)."""
    m = result.metrics
    return {"schedule": m["schedule"], "p": m["stages"], "m": m["microbatches"],
            "v": m["virtual"], "predicted": m["bubble_fraction_predicted"],
            "measured": m["bubble_fraction"], "per rank": m["bubble_fraction_per_rank"],
            "peak acts": m["peak_activations"], "step ms": result.step_time_s * 1e3}


def run_plan(plan: Plan, *, steps: int = 2, batch_size: int | None = None,
             model: ModelConfig | None = None, layer_costs: tuple[int, ...] = (),
             balance: str = "count", check_reference: bool = True, timeout_s: float = 90.0,
             **run_kwargs: Any) -> RunResult:
    """Run any valid ``Plan`` (e.g. a student's 1F1B) on ``plan.stages`` real ranks.

    The plan is validated before any process starts (``ScheduleError`` with the offending
    step marked). With ``check_reference`` the result's metrics hold
    ``max_abs_diff_grads`` / ``max_abs_diff_loss`` against one process on the whole batch.
    """
    validate_plan(plan)
    model = model or pipeline_model(256, max(4, plan.num_model_stages))
    opts = PipelineOptions(schedule="1f1b", stages=plan.stages,
                           microbatches=plan.microbatches, virtual=plan.virtual,
                           orders=orders_text(plan), layer_costs=layer_costs, balance=balance)
    config = RunConfig(strategy="pipeline", world_size=plan.stages, steps=steps,
                       batch_size=batch_size or 4 * plan.microbatches, model=model,
                       options=opts, check_reference=check_reference, timeout_s=timeout_s,
                       **run_kwargs)
    return run(config)


# ---- the mechanism on the page: a hand-written step beside labkit's executor ------------------

PAGE_MODEL = pipeline_model(64, 8)
"""The mechanism cell's model: the lesson's 8 layers, 64 wide (a check takes a moment)."""


def page_stage(ctx: Any, plan: Plan, *, model: ModelConfig = PAGE_MODEL, batch_size: int = 16,
               seed: int = 0) -> tuple[Any, Any, Any]:
    """On a rank of ``labkit.launch``: (this rank's stage, x, y). The stage is this rank's
    run of blocks of the seeded MLP (``labkit.train.models``; blocks cut evenly over the
    plan's stages, ``labkit.train.parallel.pipeline.Stage``; one stage per rank); x, y the
    task's step-0 batch of ``batch_size`` rows, the same on every rank. Call it twice for two
    equal copies: one for the cell's own pipeline step, one for ``labkits_step``."""
    from labkit.schedules.partition import bounds_by_count
    from labkit.train.data import SyntheticTask
    from labkit.train.models import build_mlp, layout_of
    from labkit.train.parallel.pipeline import Stage

    if plan.virtual != 1:
        raise ConfigError(f"page_stage cuts one stage per rank; this plan has virtual="
                          f"{plan.virtual}; e.g. build_plan('1f1b', 2, 4)")
    full = build_mlp(model, seed)
    layout, stages = layout_of(full), plan.num_model_stages
    stage = Stage(layout, full, ctx.rank, stages, bounds_by_count(len(layout.blocks), stages))
    x, y = SyntheticTask(seed, model.in_dim, model.out_dim).batch(0, batch_size)
    return stage, x, y


def labkits_step(ctx: Any, plan: Plan, stage: Any, x: Any, y: Any) -> dict[str, Any]:
    """labkit's own executor (``labkit.strategies.pipeline.engine.run_step``, what ``labkit
    run pipeline`` runs every step) on this rank's ``stage``: one step of ``plan`` on the batch
    ``x, y``; the gradients accumulate in ``stage``. Returns ``loss`` (the batch's mean loss on
    the last stage, None on the others) and ``peak_held`` (the most microbatches whose
    activations this rank held at once)."""
    from labkit.strategies.pipeline.engine import run_step

    record = run_step(ctx, plan, {stage.stage: stage}, x, y, step=0)
    return {"loss": record.loss, "peak_held": record.peak_activations}


# ---- the torch twin: the same schedule through torch.distributed.pipelining -------------------

TWIN_MODEL = ModelConfig(kind="gpt", width=32, depth=4, heads=2, seq_len=16)
"""The twin's GPT: four blocks, 32 wide, 16 characters (a run takes seconds)."""


def torch_twin(schedule: str = "1f1b", stages: int = 2, microbatches: int = 4, *,
               steps: int = 3, batch_size: int = 8, lr: float = 0.1, seed: int = 0,
               model: ModelConfig = TWIN_MODEL, timeout_s: float = 120.0) -> dict[str, Any]:
    """labkit's ``schedule`` ("gpipe" or "1f1b") and torch's ``ScheduleGPipe`` /
    ``Schedule1F1B`` on ``stages`` real ranks, each training equal copies of its stage of the
    seeded GPT for ``steps`` SGD steps on the same microbatches. Returns ``max_abs_diff`` (the
    largest parameter difference over every stage: float rounding at most), the
    per-stage differences and both loss curves (``labkit_losses``, ``torch_losses``)."""
    from labkit.api import launch
    from labkit.strategies.pipeline.torch_schedules import TORCH_SCHEDULES, compare_with_torch

    problems = []
    if schedule not in TORCH_SCHEDULES:
        problems.append(f"schedule {schedule!r} has no torch twin here; it must be one of "
                        f"{', '.join(TORCH_SCHEDULES)}; e.g. torch_twin('1f1b')")
    if not (is_int(microbatches) and is_int(batch_size) and microbatches >= 1
            and batch_size >= microbatches and batch_size % microbatches == 0):
        problems.append(f"batch_size ({batch_size!r}) must be a multiple of microbatches "
                        f"({microbatches!r}) >= 1, so every microbatch has as many rows; "
                        f"e.g. batch_size=8, microbatches=4")
    if is_int(stages) and model.depth < stages:
        problems.append(f"model.depth ({model.depth}) must be >= stages ({stages}): every "
                        f"stage holds at least one block; e.g. depth=4, stages=2")
    if problems:
        raise ConfigError(problems)
    ranks = launch(compare_with_torch, stages, schedule, microbatches, model, steps,
                   batch_size, lr, seed, timeout_s=timeout_s).results
    last = ranks[-1]
    return {"schedule": schedule, "torch_schedule": TORCH_SCHEDULES[schedule],
            "stages": stages, "microbatches": microbatches, "steps": steps,
            "max_abs_diff": max(r["max_abs_diff"] for r in ranks),
            "per_stage": [r["max_abs_diff"] for r in ranks],
            "labkit_losses": last["labkit_losses"], "torch_losses": last["torch_losses"]}
