"""labkit.theory.memory: bytes per parameter, ZeRO stages, activations, fits()."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    bytes_per_param,
    fits,
    mlp_activation_bytes,
    mlp_saved_tensors,
    transformer_activation_bytes,
    zero_comm_volume,
    zero_memory,
)

pytestmark = pytest.mark.lesson05
GB = 1e9


def test_mixed_precision_adam_is_16_bytes_per_param_with_k_12() -> None:
    """ZeRO paper: 2 B fp16 params + 2 B fp16 grads + K=12 B optimizer state (fp32 copy, m, v)."""
    assert bytes_per_param() == {"params": 2, "grads": 2, "optimizer": 12, "total": 16}


def test_fp32_adam_is_also_16_bytes_per_param() -> None:
    """Seed 003's split: 4 param + 4 grad + 8 for Adam's two moments."""
    assert bytes_per_param("fp32", "adam") == {"params": 4, "grads": 4, "optimizer": 8,
                                               "total": 16}


@pytest.mark.parametrize(
    ("precision", "optimizer", "total"),
    [("mixed", "momentum", 12), ("mixed", "sgd", 8), ("fp32", "momentum", 12),
     ("fp32", "sgd", 8)],
)
def test_other_optimizers(precision: str, optimizer: str, total: int) -> None:
    """Momentum keeps one fp32 buffer, plain SGD none (besides the mixed-precision master)."""
    assert bytes_per_param(precision, optimizer)["total"] == total


@pytest.mark.parametrize(
    ("stage", "expected_gb", "paper_gb"),
    [(0, 120.0, 120), (1, 31.40625, 31.4), (2, 16.640625, 16.6), (3, 1.875, 1.9)],
)
def test_zero_paper_figure_1_for_7_5b_params_on_64_gpus(
        stage: int, expected_gb: float, paper_gb: float) -> None:
    """Rajbhandari et al. 2020, Fig. 1: Psi = 7.5e9, N_d = 64, K = 12."""
    per_rank = zero_memory(7.5e9, 64, stage)
    assert per_rank["total"] / GB == pytest.approx(expected_gb)
    assert round(per_rank["total"] / GB, 1) == pytest.approx(paper_gb)
    assert per_rank["total"] == pytest.approx(
        per_rank["params"] + per_rank["grads"] + per_rank["optimizer"])


def test_zero_stages_shard_the_right_terms() -> None:
    """Stage 1 shards optimizer state, 2 also grads, 3 also params; stage 0 nothing."""
    full = zero_memory(1e9, 8, 0)
    for stage, sharded in [(1, {"optimizer"}), (2, {"optimizer", "grads"}),
                           (3, {"optimizer", "grads", "params"})]:
        per_rank = zero_memory(1e9, 8, stage)
        for term in ("params", "grads", "optimizer"):
            factor = 8 if term in sharded else 1
            assert per_rank[term] == pytest.approx(full[term] / factor)


def test_seed_7b_model_states_are_112_gb_not_126() -> None:
    """Seed 003 says a 7B model "needs about 126 GB" at 16 B/param, params alone 28 GB.

    7e9 x 16 B = 112 GB of model states; 28 GB is the fp32 weights. The seed's 126 GB is
    7e9 x 18 B: it matches the common mixed-precision accounting that keeps fp32 gradients
    plus both a 16-bit and an fp32 copy of the weights (2 + 4 + 4 + 8), or equivalently
    112 GB plus ~14 GB of activations and workspace. Either way it does not fit in 80 GB.
    """
    states = zero_memory(7e9, 1, 0, precision="fp32")
    assert states["total"] == pytest.approx(112 * GB)
    assert states["params"] == pytest.approx(28 * GB)
    assert pytest.approx(126 * GB) == 7e9 * 18
    assert not fits(7e9, gpus=1, gpu_gb=80, precision="fp32").fits


def test_zero_comm_volume_is_1x_ddp_for_stages_0_to_2_and_1_5x_for_stage_3() -> None:
    """ZeRO paper section 7: 2 Psi elements per rank for DDP and stages 1-2, 3 Psi for stage 3."""
    psi = 1e9
    for stage in (0, 1, 2):
        volume = zero_comm_volume(psi, stage)
        assert volume["relative_to_ddp"] == 1.0
        assert volume["total"] == pytest.approx(2 * psi * 2)  # 2 Psi elements of 2 bytes
    stage3 = zero_comm_volume(psi, 3)
    assert stage3["relative_to_ddp"] == 1.5
    assert stage3["total"] == pytest.approx(3 * psi * 2)
    assert stage3["all_gather"] == pytest.approx(2 * stage3["reduce_scatter"])


def test_zero_comm_volume_exact_ring_factor_and_fp32() -> None:
    """With dp given, each collective moves (dp-1)/dp of the tensor; fp32 doubles bytes."""
    assert zero_comm_volume(1e9, 0, dp=4)["total"] == pytest.approx(2 * 1e9 * 2 * 3 / 4)
    assert zero_comm_volume(1e9, 0, "fp32")["total"] == pytest.approx(2 * 1e9 * 4)


def test_transformer_activations_match_korthikanti_formula() -> None:
    """Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per layer at 16 bits."""
    s, b, h, a, layers = 2048, 4, 4096, 32, 2
    paper = s * b * h * (34 + 5 * a * s / h) * layers
    assert transformer_activation_bytes(b, s, h, a, layers) == pytest.approx(paper)


def test_transformer_activations_fp32_and_checkpointing() -> None:
    """fp32 doubles the saved values but not the 1-byte dropout masks; checkpointing keeps
    only each layer's input."""
    s, b, h, a = 128, 2, 256, 4
    fp32 = transformer_activation_bytes(b, s, h, a, bytes_per_value=4)
    assert fp32 == pytest.approx(s * b * h * 66 + a * s * s * b * 9)
    kept = transformer_activation_bytes(b, s, h, a, layers=12, checkpointing=True)
    assert kept == pytest.approx(2 * s * b * h * 12)


def test_mlp_activation_bytes_counts_input_and_relu_outputs_once() -> None:
    """Linear(784,256)+ReLU, Linear(256,10)+ReLU: input 784, ReLU outputs 256 and 10."""
    assert mlp_activation_bytes(64, [784, 256, 10]) == 64 * (784 + 256 + 10) * 4
    assert mlp_activation_bytes(64, [784, 256, 10], final_relu=False) == 64 * (784 + 256) * 4
    assert mlp_activation_bytes(64, [784, 256, 10], bytes_per_value=2) == 64 * 1050 * 2


def test_mlp_checkpointing_keeps_block_inputs_only() -> None:
    """Per-block checkpointing keeps w0 .. w_{L-1} per sample."""
    assert mlp_activation_bytes(8, [32, 64, 64, 4], checkpointing=True) == 8 * 160 * 4


def test_mlp_saved_tensors_agree_with_the_byte_count() -> None:
    """Deduplicating the listed saves by shared storage gives mlp_activation_bytes."""
    for final_relu in (True, False):
        saves = mlp_saved_tensors(16, [20, 30, 40, 5], final_relu=final_relu)
        unique = [e for e in saves if e["shares_with"] is None]
        values = sum(e["shape"][0] * e["shape"][1] for e in unique)  # type: ignore[index]
        assert values * 4 == mlp_activation_bytes(16, [20, 30, 40, 5], final_relu=final_relu)
    saves = mlp_saved_tensors(16, [20, 30, 5])
    assert [(e["layer"], e["shares_with"]) for e in saves] == [
        ("linear0", None), ("relu0", None), ("linear1", "relu0.output"), ("relu1", None)]


def test_seed_exercise_3b_params_on_four_24gb_gpus() -> None:
    """Seed 000, exercise 2: 3B params, BF16, Adam, 4 x 24 GB: pure DP fails, ZeRO-2/3 fit."""
    plain = fits(3e9, gpus=4, gpu_gb=24, stage=0)
    assert not plain.fits
    assert plain.per_gpu_bytes["total"] == pytest.approx(48 * GB)
    assert plain.binding == "optimizer"
    assert plain.capacity_bytes == 24 * GB
    assert plain.dp == 4
    assert "Does not fit" in plain.explanation and "ZeRO-1 would need 21.0 GB" in plain.explanation
    zero2 = fits(3e9, gpus=4, gpu_gb=24, stage=2)
    assert zero2.fits and zero2.per_gpu_bytes["total"] == pytest.approx(16.5 * GB)
    zero3 = fits(3e9, gpus=4, gpu_gb=24, stage=3)
    assert zero3.fits and zero3.per_gpu_bytes["total"] == pytest.approx(12 * GB)
    assert zero3.explanation.startswith("Fits")


def test_fits_with_model_parallelism_and_activations() -> None:
    """tp*pp divides the parameters; activations add on top and can become the binding term."""
    report = fits(3e9, gpus=4, gpu_gb=24, tp=2, pp=2, activation_gb=15)
    assert report.dp == 1
    assert report.per_gpu_bytes["params"] == pytest.approx(0.75e9 * 2)
    assert report.per_gpu_bytes["activations"] == pytest.approx(15 * GB)
    assert report.per_gpu_bytes["total"] == pytest.approx(27 * GB)
    assert report.binding == "activations" and not report.fits


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: zero_memory(7.5e9, 64, 4), "stage (4)"),
        (lambda: zero_memory(7.5e9, 64, True), "stage (True)"),
        (lambda: zero_memory(7.5e9, 0, 1), "dp (0)"),
        (lambda: zero_memory(-1, 4, 1), "params (-1)"),
        (lambda: bytes_per_param("bf16"), "precision ('bf16')"),
        (lambda: bytes_per_param("mixed", "lamb"), "optimizer ('lamb')"),
        (lambda: zero_comm_volume(1e9, 5), "stage (5)"),
        (lambda: transformer_activation_bytes(0, 128, 256, 4), "batch (0)"),
        (lambda: mlp_activation_bytes(8, [32]), "widths ([32])"),
        (lambda: mlp_activation_bytes(8, [32, 0]), "widths[1] (0)"),
        (lambda: fits(3e9, gpus=4, gpu_gb=24, tp=3), "gpus (4)"),
        (lambda: fits(3e9, gpus=4, gpu_gb=0), "gpu_gb (0)"),
        (lambda: fits(3e9, gpus=4, gpu_gb=24, activation_gb=-1), "activation_gb (-1)"),
    ],
)
def test_bad_input_raises_config_error_naming_the_value(call, names: str) -> None:
    """Every bad argument raises ConfigError whose message names the value and an example."""
    with pytest.raises(ConfigError) as info:
        call()
    assert names in str(info.value)
    assert "e.g." in str(info.value)


def test_stage_message_matches_the_house_style_exactly() -> None:
    """The brief's example message, word for word."""
    with pytest.raises(ConfigError, match=r"^stage \(4\) must be 0, 1, 2 or 3 \(ZeRO stages\); "
                                          r"e\.g\. stage=2$"):
        zero_memory(1e9, 8, 4)


def test_the_rounding_tolerance_is_per_optimizer_and_scales_with_lr_times_steps():
    """labkit.theory.rounding: SGD-like updates stay near 1e-8 (tolerance 1e-5 x lr x steps,
    floor 1e-6), Adam-like ones can reach a fraction of lr (1e-3 x lr x steps)."""
    from labkit.theory import rounding_text, same_weights_tolerance

    assert same_weights_tolerance("sgd", 0.05, 10) == pytest.approx(5e-6)
    assert same_weights_tolerance("sgd", 0.001, 1) == 1e-6  # the floor
    assert same_weights_tolerance("adam", 0.05, 40) == pytest.approx(2e-3)
    assert same_weights_tolerance("sgd", 0.4, 40) == pytest.approx(1.6e-4)  # lesson 11's server
    assert "5e-04 after 10 steps of adam" in rounding_text("adam", 0.05, 10)
    with pytest.raises(ValueError, match="optimizer 'rmsprop'"):
        same_weights_tolerance("rmsprop", 0.1, 1)
