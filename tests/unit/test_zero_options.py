"""ZeRO strategy options: bad input is rejected before any process starts."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.config.run import ModelConfig, RunConfig
from labkit.strategies.zero import ZeroOptions, layer_sizes

pytestmark = pytest.mark.lesson05


def test_stage_4_is_rejected_with_the_valid_stages_named() -> None:
    with pytest.raises(ConfigError, match=r"stage \(4\) must be one of 0, 1, 2, 3"):
        ZeroOptions(stage=4)


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_other_bad_stages_are_rejected(bad: object) -> None:
    with pytest.raises(ConfigError, match="stage"):
        ZeroOptions(stage=bad)  # type: ignore[arg-type]


def test_bad_impl_and_precision_are_both_named_in_one_error() -> None:
    with pytest.raises(ConfigError) as err:
        ZeroOptions(impl="deepspeed", precision="fp8")
    text = str(err.value)
    assert "'deepspeed'" in text and "'fp8'" in text


@pytest.mark.parametrize("stage", [0, 2])
def test_torch_impl_only_has_stages_1_and_3(stage: int) -> None:
    with pytest.raises(ConfigError, match="ZeroRedundancyOptimizer"):
        ZeroOptions(stage=stage, impl="torch")


def test_torch_impl_rejects_bf16_and_checkpointing() -> None:
    with pytest.raises(ConfigError, match="bf16"):
        ZeroOptions(stage=3, impl="torch", precision="bf16")
    with pytest.raises(ConfigError, match="checkpointing"):
        ZeroOptions(stage=1, impl="torch", checkpointing=True)


def test_layer_sizes_match_build_mlp() -> None:
    """in 32 -> 128 -> 128 -> 10: weights plus biases of the three Linear layers."""
    assert layer_sizes(ModelConfig(width=128, depth=2)) == [32 * 128 + 128, 128 * 128 + 128,
                                                            128 * 10 + 10]


def test_no_pad_needs_every_layer_to_divide_by_world_size() -> None:
    """33 hidden units: layer 0 has 32*33+33 = 1089 params, odd, so 2 ranks cannot split it."""
    with pytest.raises(ConfigError, match=r"divisible by world_size \(2\).*layer 0 has 1089"):
        RunConfig(strategy="zero", world_size=2, model=ModelConfig(width=33),
                  options={"stage": 2, "pad": False})
    # padding on (the default) accepts the same model
    RunConfig(strategy="zero", world_size=2, model=ModelConfig(width=33), options={"stage": 2})


def test_options_from_a_dict_and_unknown_option() -> None:
    cfg = RunConfig(strategy="zero", options={"stage": 3, "precision": "bf16"})
    assert cfg.options == ZeroOptions(stage=3, precision="bf16")
    with pytest.raises(ConfigError, match="unknown option"):
        RunConfig(strategy="zero", options={"shards": 2})
