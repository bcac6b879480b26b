"""Pipeline strategy options: bad input is rejected before any process starts."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.config.run import ModelConfig, RunConfig
from labkit.schedules import build_plan
from labkit.strategies.pipeline import PipelineOptions, orders_text, parse_orders, plan_for

pytestmark = pytest.mark.lesson03


def _config(**kw: object) -> RunConfig:
    opts = kw.pop("options", {})
    base: dict[str, object] = {"strategy": "pipeline", "world_size": 2, "batch_size": 32,
                               "model": ModelConfig(width=64, depth=4)}
    base.update(kw)
    return RunConfig(options=opts, **base)  # type: ignore[arg-type]


def test_valid_config_builds_options_and_defaults_virtual() -> None:
    """A plain 1F1B config validates; interleaved defaults to two chunks per rank."""
    cfg = _config(options={"schedule": "1f1b", "microbatches": 4})
    assert isinstance(cfg.options, PipelineOptions)
    assert PipelineOptions(schedule="interleaved").resolved_virtual() == 2
    assert PipelineOptions(schedule="gpipe").resolved_virtual() == 1


@pytest.mark.parametrize("kw, needle", [
    ({"options": {"schedule": "interleaved", "microbatches": 3}},
     "microbatches (3) must be a multiple of stages (2)"),
    ({"options": {"schedule": "1f1b", "stages": 4}, "world_size": 4,
      "model": ModelConfig(width=64, depth=3)}, "must be <= model.depth (3 layers)"),
    ({"options": {"schedule": "interleaved", "virtual": 3}, "model": ModelConfig(depth=4)},
     "(2 x 3 = 6 model stages) must be <= model.depth (4"),
    ({"options": {"microbatches": 5}}, "batch_size (32) must be divisible by microbatches (5)"),
    ({"options": {"stages": 3}}, "stages (3) must equal world_size (2)"),
    ({"options": {"layer_costs": (1, 2)}}, "layer_costs has 2 entries but model.depth is 4"),
])
def test_cross_field_rules_reject_bad_input(kw: dict[str, object], needle: str) -> None:
    """Each rule of the issue fails at RunConfig() with the value and the rule named."""
    with pytest.raises(ConfigError) as err:
        _config(**kw)
    assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize("kw, needle", [
    ({"schedule": "pipedream"}, "schedule ('pipedream') must be one of"),
    ({"microbatches": 0}, "microbatches (0) must be >= 1"),
    ({"schedule": "interleaved", "virtual": 1}, "virtual (1) must be >= 2"),
    ({"schedule": "gpipe", "virtual": 2}, "virtual (2) must be 1 for schedule 'gpipe'"),
    ({"layer_costs": (1, 0)}, "layer_costs ((1, 0)) must be a list of integers >= 1"),
    ({"balance": "flops"}, "balance ('flops') must be one of count, cost"),
])
def test_options_reject_bad_values(kw: dict[str, object], needle: str) -> None:
    """The options dataclass names every bad value and the rule."""
    with pytest.raises(ConfigError) as err:
        PipelineOptions(**kw)  # type: ignore[arg-type]
    assert needle in str(err.value)


def test_orders_round_trip_through_text() -> None:
    """A plan written as text (the --orders flag) parses back to the same actions."""
    plan = build_plan("1f1b", 2, 4)
    text = orders_text(plan)
    assert text.startswith("0F0 0F1 0B0")
    parsed = parse_orders(text)
    assert {r: [str(a) for a in acts] for r, acts in parsed.items()} == {
        r: [str(a) for a in plan.actions(r)] for r in (0, 1)}


def test_broken_orders_are_rejected_with_the_step_marked() -> None:
    """A hand-written plan missing a backward fails the config check with the plan table."""
    with pytest.raises(ConfigError) as err:
        _config(options={"microbatches": 2, "orders": "0F0 0F1 0B0; 1F0 1B0 1F1 1B1"})
    assert "0B1 is missing" in str(err.value)
    with pytest.raises(ConfigError) as err:  # backward before the gradient arrives: deadlock
        _config(options={"microbatches": 1, "orders": "0F0 0B0; 1B0 1F0"})
    assert "deadlock" in str(err.value)


def test_plan_for_builds_the_named_schedule() -> None:
    plan = plan_for(PipelineOptions(schedule="interleaved", microbatches=4), 2)
    assert (plan.schedule, plan.virtual, plan.num_model_stages) == ("interleaved", 2, 4)
