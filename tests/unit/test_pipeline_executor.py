"""The executor's math in one process: P=1 plans (stages pass tensors locally).

With one rank every message stays on the rank, so these tests pin down the per-action math
(forward, full backward, the I / W split, loss scaling by 1/M) against a plain full-batch
backward, without starting processes. The distributed tests cover the wire.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from labkit.config.run import ModelConfig
from labkit.rank.context import RankContext
from labkit.schedules import build_plan
from labkit.schedules.partition import bounds_by_count
from labkit.strategies.pipeline.engine import input_grads, run_step, tag, weight_grads
from labkit.trace.tracer import Tracer
from labkit.train.data import SyntheticTask
from labkit.train.models import build_mlp, layout_of
from labkit.train.parallel.pipeline import Stage

pytestmark = pytest.mark.lesson03
MODEL = ModelConfig(in_dim=8, width=32, depth=4, out_dim=5)


def build_full(model: ModelConfig, costs: tuple[int, ...], seed: int) -> nn.Sequential:
    return build_mlp(model, seed, costs)


def StageModule(full: nn.Sequential, stage: int, num: int, bounds: list[int]) -> Stage:
    """Stage ``stage`` of the MLP ``full`` (blocks of one Linear+ReLU pair each, or as many
    as ``full``'s block costs put together)."""
    return Stage(layout_of(full), full, stage, num, bounds)


def _ctx() -> RankContext:
    return RankContext(rank=0, world_size=1, local_rank=0, backend="gloo",
                       device=torch.device("cpu"), tracer=Tracer(0), comm=None)  # type: ignore[arg-type]


def _reference(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    full = build_full(MODEL, (1, 2, 1, 1), seed=3)
    nn.functional.cross_entropy(full(x), y).backward()
    return {n: p.grad for n, p in full.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("schedule, virtual", [("gpipe", 1), ("1f1b", 1), ("zb", 1),
                                               ("interleaved", 2)])
def test_single_rank_plan_matches_full_batch_gradients(schedule: str, virtual: int) -> None:
    """Every schedule's gradients equal one full-batch backward (max abs diff <= 1e-5)."""
    x, y = SyntheticTask(3, MODEL.in_dim, MODEL.out_dim).batch(0, 16)
    plan = build_plan(schedule, 1, 4, virtual)
    num = plan.num_model_stages
    full = build_full(MODEL, (1, 2, 1, 1), seed=3)
    mods = {s: StageModule(full, s, num, bounds_by_count(4, num)) for s in range(num)}
    ctx = _ctx()
    rec = run_step(ctx, plan, mods, x, y, step=0)
    ref = _reference(x, y)
    for mod in mods.values():
        for name, p in zip(mod.param_names(), mod.parameters()):
            diff = float((p.grad - ref[name]).abs().max())
            assert diff <= 1e-5, f"{schedule}: gradient of {name} differs by {diff}"
    with torch.no_grad():
        expected_loss = float(nn.functional.cross_entropy(build_full(MODEL, (1, 2, 1, 1), 3)(x), y))
    assert rec.loss == pytest.approx(expected_loss, abs=1e-5)
    names = [e.name for e in ctx.tracer.events() if e.stage is not None]
    assert sorted(names) == sorted(str(a) for a in plan.actions(0)), "one span per action"
    assert rec.messages == 0 and rec.bytes_sent == 0  # all transfers were local


def test_gpipe_holds_all_microbatches_and_1f1b_one() -> None:
    """Peak activations are counted exactly: GPipe m, 1F1B on one stage 1."""
    x, y = SyntheticTask(0, MODEL.in_dim, MODEL.out_dim).batch(0, 16)
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        full = build_full(MODEL, (), seed=0)
        mods = {0: StageModule(full, 0, 1, [0, 4])}
        peaks[schedule] = run_step(_ctx(), build_plan(schedule, 1, 4), mods, x, y, 0
                                   ).peak_activations
    assert peaks == {"gpipe": 4, "1f1b": 1}


def test_stage_modules_chain_to_the_full_model() -> None:
    """Stages cover every parameter once, and chaining them equals the full forward."""
    full = build_full(MODEL, (1, 1, 3, 1), seed=1)
    bounds = [0, 1, 3, 4]
    stages = [StageModule(full, s, 3, bounds) for s in range(3)]
    names = [n for st in stages for n in st.param_names()]
    assert sorted(names) == sorted(n for n, _ in full.named_parameters())
    x = torch.randn(5, MODEL.in_dim)
    h = x
    for st in stages:
        h = st(h)
    assert torch.allclose(h, full(x))


def test_message_tags_are_unique() -> None:
    tags = {tag(k, s, m, 4) for k in (0, 1) for s in range(4) for m in range(4)}
    assert len(tags) == 2 * 4 * 4 and min(tags) >= 1


def test_zero_bubble_i_computes_no_weight_grad_and_w_completes_them() -> None:
    """I leaves every .grad empty and returns the input grad; W then gives backward()'s
    weight grads, matmul by matmul, for a middle stage (input needs a grad too)."""
    full = build_full(MODEL, (1, 2, 1, 1), seed=3)
    bounds = bounds_by_count(MODEL.depth, 2)
    ours, ref = StageModule(full, 1, 2, bounds), StageModule(build_full(MODEL, (1, 2, 1, 1), 3),
                                                             1, 2, bounds)
    x = torch.randn(6, MODEL.width, generator=torch.Generator().manual_seed(0))
    g_out = torch.randn(6, MODEL.out_dim, generator=torch.Generator().manual_seed(1))
    x_ref = x.clone().requires_grad_()
    ref(x_ref).backward(g_out)
    x_ours = x.clone().requires_grad_()
    with ours.recording_linears() as linears:
        out = ours(x_ours)
    assert len(linears) == 3  # layers 2 and 3 (one Linear each), then the head
    g_in, pending = input_grads(out, x_ours, linears, g_out)
    assert all(p.grad is None for p in ours.parameters())
    assert torch.allclose(g_in, x_ref.grad, atol=1e-6)
    weight_grads(pending)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert p.grad.grad_fn is None and not p.grad.requires_grad, name  # plain tensors
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_zero_bubble_refuses_a_stage_with_non_linear_weights() -> None:
    from labkit.base.errors import ConfigError
    from labkit.strategies.pipeline.engine import check_only_linears

    stage = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with pytest.raises(ConfigError, match=r"nn.Linear layers only.*'1.weight'"):
        check_only_linears(stage)
    check_only_linears(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
