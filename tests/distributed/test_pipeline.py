"""Pipeline schedules on real gloo ranks, checked against one process and against torch.

Every schedule must give the single-process gradients (max abs diff <= 1e-5), count its
activations and messages exactly, and put one named span on the timeline per action.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from labkit.api import launch, run
from labkit.base.errors import ConfigError
from labkit.config.run import ModelConfig
from labkit.launchers.results import RunResult
from labkit.lessons.pipeline import bubble_breakdown, run_plan
from labkit.schedules import Plan, build_plan, one_f_one_b
from labkit.strategies.pipeline.metrics import actions_of

pytestmark = [pytest.mark.distributed, pytest.mark.lesson03]
MODEL = ModelConfig(width=64, depth=4)
TOL = 1e-5


def _check_run(result: RunResult, plan: Plan) -> None:
    """Correctness, exact counts and the timeline of one run of ``plan``."""
    for rank, out in enumerate(result.outputs):
        for key in ("max_abs_diff_grads", "max_abs_diff_vs_reference", "max_abs_diff_loss"):
            value = out.metrics[key]
            assert value <= TOL, f"{plan.schedule}: rank {rank} {key} = {value} > {TOL}"
    m = result.metrics
    assert m["peak_activations"] == m["peak_activations_predicted"]
    crossings = sum(1 for s in range(plan.num_model_stages - 1)
                    if plan.stage_to_rank(s) != plan.stage_to_rank(s + 1))
    assert m["p2p_messages_per_step"] == 2 * crossings * plan.microbatches
    for key in ("bubble_fraction", "bubble_fraction_predicted"):
        assert 0.0 <= m[key] < 1.0, f"{key} = {m[key]}"
    assert len(m["bubble_fraction_per_rank"]) == plan.stages
    for step in range(result.config.steps):
        for rank in range(plan.stages):
            names = sorted(e.name for e in result.timeline.select(rank=rank, step=step)
                           if e.lane.value == "compute" and e.stage is not None)
            assert names == sorted(str(a) for a in plan.actions(rank)), (
                f"rank {rank} step {step}: spans {names} != plan")
        sends = [e for e in result.timeline.select(step=step) if e.op.value == "send"]
        recvs = [e for e in result.timeline.select(step=step) if e.op.value == "recv"]
        assert len(sends) == len(recvs) == m["p2p_messages_per_step"]
        assert all(e.microbatch is not None and e.stage is not None for e in sends + recvs)


def test_gpipe_from_the_cli_matches_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    """`labkit run pipeline --schedule gpipe ... --json` reports the contract's keys."""
    from labkit.cli import main

    code = main(["run", "pipeline", "--schedule", "gpipe", "--stages", "2", "--microbatches",
                 "4", "--steps", "2", "--width", "64", "--depth", "4", "--check-reference",
                 "--json", "--timeout", "90", "--no-progress"])
    assert code == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    m = out["metrics"]
    assert m["bubble_fraction_predicted"] == pytest.approx(1 / 5)
    assert 0.0 <= m["bubble_fraction"] < 1.0
    assert m["max_abs_diff_grads"] <= TOL and m["max_abs_diff_loss"] <= TOL
    assert m["peak_activations"] == [4, 4]


@pytest.mark.parametrize("schedule, micro, virtual", [("1f1b", 4, 1), ("interleaved", 4, 2),
                                                      ("zb", 4, 1)])
def test_schedule_matches_one_process(schedule: str, micro: int, virtual: int) -> None:
    """1F1B, interleaved (V=2) and zero bubble: same loss and gradients as one process."""
    plan = build_plan(schedule, 2, micro, virtual)
    result = run_plan(plan, steps=2, batch_size=16, model=MODEL, timeout_s=90, progress=False)
    _check_run(result, plan)
    # a hand-run plan is "custom": the breakdown needs the plan, and its parts add up
    with pytest.raises(ConfigError, match="plan=my_plan"):
        bubble_breakdown(result)
    split = bubble_breakdown(result, plan)
    assert split["measured"] == result.metrics["bubble_fraction"]
    assert 0.0 <= split["replayed"] < 1.0
    assert split["uneven compute"] + split["waiting for a core"] + split["communication"] == \
        pytest.approx(split["measured"] - split["predicted"])
    # an action's CPU time never exceeds the wall time it ran in (the shares above may: a wait
    # that falls on the lighter stage evens the stages out and shrinks the walls' bubble)
    timed = [e for e in actions_of(result.timeline.events) if e.cpu_ns is not None]
    assert timed and all(e.cpu_ns <= e.dur_ns + 50_000 for e in timed)


def test_balance_by_measured_cost_moves_the_heavy_layer() -> None:
    """Layer costs 1,1,1,6: equal counts give stages of cost 2 and 7; measured balancing
    puts three light layers on stage 0 (3 vs 6), and the gradients still match."""
    cfg_model = ModelConfig(width=512, depth=4)
    result = run(strategy="pipeline", world_size=2, steps=2, batch_size=32, model=cfg_model,
                 check_reference=True, timeout_s=120, progress=False,
                 options={"schedule": "1f1b", "microbatches": 4, "layer_costs": (1, 1, 1, 6),
                          "balance": "cost"})
    assert result.metrics["stage_bounds"] == [0, 3, 4]
    assert result.metrics["max_abs_diff_grads"] <= TOL


def _against_torch_pipelining(ctx: Any, micro: int, batch: int, seed: int) -> dict[str, Any]:
    import torch
    from torch.nn import functional as F

    from labkit.schedules.partition import bounds_by_count
    from labkit.strategies.pipeline.engine import run_step
    from labkit.train.data import SyntheticTask
    from labkit.train.models import build_mlp, layout_of
    from labkit.train.parallel.pipeline import Stage

    def stage_of(seed: int, stage: int, num: int, bounds: list[int]) -> Stage:
        full = build_mlp(MODEL, seed)
        return Stage(layout_of(full), full, stage, num, bounds)

    try:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    except ImportError as err:  # pragma: no cover - old torch
        return {"skip": f"torch.distributed.pipelining unavailable: {err}"}
    p = ctx.world_size
    bounds = bounds_by_count(MODEL.depth, p)
    x, y = SyntheticTask(seed, MODEL.in_dim, MODEL.out_dim).batch(0, batch)
    theirs = stage_of(seed, ctx.rank, p, bounds)
    schedule = Schedule1F1B(PipelineStage(theirs, ctx.rank, p, torch.device("cpu")),
                            n_microbatches=micro, loss_fn=lambda o, t: F.cross_entropy(o, t))
    if ctx.rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y)
    ours = stage_of(seed, ctx.rank, p, bounds)
    run_step(ctx, one_f_one_b(p, micro), {ctx.rank: ours}, x, y, 0)
    diffs = {n: float((a.grad - b.grad).abs().max()) for n, a, b in zip(
        ours.param_names(), theirs.parameters(), ours.parameters())}
    return {"diffs": diffs}


def test_matches_torch_distributed_pipelining_1f1b() -> None:
    """Our 1F1B and torch.distributed.pipelining.Schedule1F1B give the same gradients."""
    res = launch(_against_torch_pipelining, 2, 4, 32, 0, timeout_s=90)
    for rank, out in enumerate(res.results):
        if "skip" in out:
            pytest.skip(out["skip"])
        for name, diff in out["diffs"].items():
            assert diff <= TOL, f"rank {rank}: grad of {name} differs from torch by {diff}"


def test_a_pipeline_run_hashes_the_whole_model_in_one_order() -> None:
    """Every stage's weights go into one ``params_sha256``, in name order: GPipe, 1F1B and
    zero bubble end with the same weights here, so with the same hash; the CLI reports it."""
    import subprocess
    import sys

    from labkit.strategies.pipeline import pipeline_model

    hashes = {s: run(strategy="pipeline", world_size=2, steps=2, batch_size=16,
                            model=pipeline_model(64, 4), progress=False, threads_per_rank=1,
                            options={"schedule": s, "microbatches": 4}).params_sha256
              for s in ("gpipe", "1f1b", "zb")}
    assert None not in hashes.values() and len(set(hashes.values())) == 1, hashes
    out = subprocess.run([sys.executable, "-m", "labkit", "run", "hybrid", "--pp", "2",
                          "--model", "gpt", "--width", "32", "--depth", "2", "--seq-len", "16",
                          "--steps", "1", "--batch-size", "4", "--json"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["params_sha256"]) == 64
