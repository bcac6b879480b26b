"""labkit.theory.activations against Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), and fits() counting activations."""

from __future__ import annotations

import pytest

from labkit.base.errors import ConfigError
from labkit.theory import (
    TransformerShape,
    fits,
    layer_activation_bytes,
    model_activation_bytes,
    transformer_activation_bytes,
)

pytestmark = pytest.mark.lesson05
GB = 1e9
GPT3 = {"seq": 2048, "hidden": 12288, "heads": 96}
"""GPT-3 175B as the paper trains it (its Table 3): s = 2048, h = 12288, a = 96."""


@pytest.mark.parametrize(("s", "b", "h", "a"), [(2048, 1, 12288, 96), (2048, 4, 6144, 64),
                                                 (512, 3, 256, 8)])
def test_equation_1_without_parallelism(s: int, b: int, h: int, a: int) -> None:
    """Eq. 1: s*b*h*(34 + 5*a*s/h) bytes per layer; the older function agrees at 2 B."""
    paper = s * b * h * (34 + 5 * a * s / h)
    assert layer_activation_bytes(s, b, h, a) == pytest.approx(paper)
    assert transformer_activation_bytes(b, s, h, a) == pytest.approx(paper)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_tensor_and_sequence_parallel_equations(t: int) -> None:
    """Eq. 2 (tensor parallel): s*b*h*(10 + 24/t + 5*a*s/(h*t)); eq. 3 (with sequence
    parallelism): s*b*h/t*(34 + 5*a*s/h); at t = 1 both are eq. 1."""
    s, b, h, a = 2048, 1, 12288, 96
    assert layer_activation_bytes(s, b, h, a, tp=t) == pytest.approx(
        s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert layer_activation_bytes(s, b, h, a, tp=t, sequence_parallel=True) == pytest.approx(
        s * b * h / t * (34 + 5 * a * s / h))


def test_recomputation_rows_of_table_2() -> None:
    """Selective recomputation drops the attention term (s*b*h*(10 + 24/t), or 34/t with
    sequence parallelism); full recomputation keeps only the input, 2*s*b*h."""
    s, b, h, a, t = 2048, 2, 4096, 32, 4
    assert layer_activation_bytes(s, b, h, a, tp=t, recompute="selective") == pytest.approx(
        s * b * h * (10 + 24 / t))
    assert layer_activation_bytes(s, b, h, a, tp=t, sequence_parallel=True,
                                  recompute="selective") == pytest.approx(s * b * h * 34 / t)
    assert layer_activation_bytes(s, b, h, a, tp=t, recompute="full") == 2 * s * b * h


def test_gpt3_attention_term_is_80_and_selective_saves_70_percent() -> None:
    """The paper's GPT-3 numbers: 5*a*s/h = 80 (more than the 34 of everything else), so
    selective recomputation with sequence parallelism cuts activations by about 70 %."""
    one = layer_activation_bytes(**GPT3, batch=1)
    sbh = 2048 * 12288
    assert one / sbh - 34 == pytest.approx(80)
    full = layer_activation_bytes(**GPT3, batch=1, tp=8, sequence_parallel=True)
    selective = layer_activation_bytes(**GPT3, batch=1, tp=8, sequence_parallel=True,
                                       recompute="selective")
    assert 1 - selective / full == pytest.approx(0.70, abs=0.005)


def test_model_activations_are_l_layers_plus_one_recomputed_layer() -> None:
    """L layers' worth on the busiest GPU; with full recomputation L inputs plus the one
    layer alive while it is recomputed."""
    shape = TransformerShape(layers=36, hidden=2560, heads=32, seq=2048, micro_batch=1)
    layer = layer_activation_bytes(2048, 1, 2560, 32)
    assert model_activation_bytes(shape) == pytest.approx(36 * layer)
    assert model_activation_bytes(shape, recompute="full") == pytest.approx(
        36 * 2 * 2048 * 2560 + layer)
    assert shape.params == pytest.approx(12 * 36 * 2560**2 + 50257 * 2560)


def test_seed_exercise_needs_recomputation_once_activations_count() -> None:
    """Seed 000 exercise 2 (3B, bf16 Adam, 4 x 24 GB) with a 3B GPT's activations at s = 2048,
    b = 1: 30.6 GB, so no ZeRO stage fits without recomputation; with full recomputation
    ZeRO-1, -2 and -3 do, and the explanation says what recomputation would need."""
    shape = TransformerShape(layers=36, hidden=2560, heads=32)
    plain = [fits(3e9, gpus=4, gpu_gb=24, stage=s, shape=shape) for s in range(4)]
    assert not any(r.fits for r in plain)
    assert plain[2].per_gpu_bytes["activations"] == pytest.approx(model_activation_bytes(shape))
    assert plain[2].binding == "activations"
    assert "selective activation recomputation would need 22.9 GB" in plain[2].explanation
    full = [fits(3e9, gpus=4, gpu_gb=24, stage=s, shape=shape, recompute="full")
            for s in range(4)]
    assert [r.fits for r in full] == [False, True, True, True]


def test_fits_keeps_its_old_calls_and_says_when_activations_are_not_counted() -> None:
    """activation_gb still works as before; with neither it nor a shape the activations are
    0 and the sentence says so; both at once is an error naming both."""
    assert fits(3e9, gpus=4, gpu_gb=24, activation_gb=6).per_gpu_bytes["activations"] == 6 * GB
    bare = fits(3e9, gpus=4, gpu_gb=24, stage=2)
    assert not bare.activations_counted and "activations not counted" in bare.explanation
    with pytest.raises(ConfigError, match="not both"):
        fits(3e9, gpus=4, gpu_gb=24, activation_gb=6,
             shape=TransformerShape(layers=2, hidden=64, heads=4))


@pytest.mark.parametrize(("call", "names"), [
    (lambda: layer_activation_bytes(2048, 1, 2560, 32, recompute="some"), "recompute ('some')"),
    (lambda: layer_activation_bytes(2048, 1, 2560, 32, tp=0), "tp (0)"),
    (lambda: TransformerShape(layers=2, hidden=100, heads=3), "hidden (100)"),
    (lambda: TransformerShape(layers=0, hidden=64, heads=4), "layers (0)"),
])
def test_bad_input_names_the_value(call, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert names in str(info.value) and "e.g." in str(info.value)


def test_layer_norm_bytes_divide_by_t_under_sequence_parallelism():
    from labkit.theory import layer_activation_bytes, layer_norm_activation_bytes

    whole = layer_norm_activation_bytes(2048, 1, 12288, tp=8, bytes_per_value=2)
    assert whole == 4 * 2048 * 12288  # Korthikanti's 4sbh for the two LayerNorms
    assert layer_norm_activation_bytes(2048, 1, 12288, tp=8, sequence_parallel=True,
                                       bytes_per_value=2) == whole / 8
    # eq. 2 -> eq. 3 saves the 10*sbh*(1 - 1/t) of the regions TP leaves whole
    saved = layer_activation_bytes(2048, 1, 12288, 96, tp=8) - layer_activation_bytes(
        2048, 1, 12288, 96, tp=8, sequence_parallel=True)
    assert saved == pytest.approx(10 * 2048 * 12288 * (1 - 1 / 8))
    with pytest.raises(ConfigError, match="must divide seq"):
        layer_norm_activation_bytes(10, 1, 8, tp=4, sequence_parallel=True)


def test_sequence_parallel_sends_tp_all_reduce_bytes_plus_its_ends():
    from labkit.theory import parallel_layout

    kw = {"width": 64, "depth": 2, "heads": 4, "seq_len": 16, "tp": 4, "pp": 2,
          "microbatches": 2, "batch_size": 8}
    tp, sp = parallel_layout(**kw), parallel_layout(**kw, sequence_parallel=True)
    act = 4 * 16 * 64 * 4
    assert sp.traffic["tp"] - tp.traffic["tp"] == pytest.approx(
        4 * 2 * 3 / 4 * (2 * act + 2 * 2 * 24 * 64))
    assert sp.traffic["pp"] == tp.traffic["pp"] / 4
