"""The planner (labkit.theory.plan) against published runs, one set of constants for all.

Every number below carries its source. Targets (issue 38): MFU (or hardware FLOP/s) within
+-15 % relative, memory within 10 % where the source gives it, the published dp x tp x pp
among the planner's top 3 shapes or within 10 % of the best predicted throughput. A case the
model misses is marked xfail with the reason; no constant is tuned to one case.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from labkit.cli import main
from labkit.theory.activations import GPT_3B
from labkit.theory.plan import plan, predict, rank_of, with_layout
from labkit.theory.plan_models import GPUS, Cluster, Decoder, Training, cluster, get_model
from labkit.theory.plan_terms import Layout, decoder_layer_bytes

A100_PEAK, H100_PEAK = 312e12, 989e12


def _megatron_gpt(layers: int, hidden: int, heads: int) -> Decoder:
    """Narayanan et al. 2021, section 5.1: vocabulary 51,200, sequence 2048, GPT layers."""
    return Decoder(f"gpt-{layers}x{hidden}", layers, hidden, heads, heads, 4 * hidden, False,
                   51200, 2048, bias=True, learned_positions=True)


def _close(predicted: float, published: float, tolerance: float) -> bool:
    return abs(predicted / published - 1) <= tolerance


# Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", SC21), Table 1: params (B), heads, hidden, layers, TP, PP, GPUs, batch
# (sequences), achieved TFLOP/s per GPU (their eq. 3: recomputation counted); A100 80 GB,
# interleaved schedule, full activation recomputation, Selene (8 x HDR per node).
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SMALL_GEMMS = ("the smallest rows (h <= 4096, TP <= 4) run GEMMs far below the shape where the "
               "A100's MAMF is measured; one compute efficiency for every size cannot see it "
               "(Narayanan et al. attribute their superlinear scaling to exactly this)")


def _megatron_case(row: tuple) -> tuple[Decoder, Cluster, Training, dict[str, int], float]:
    _, heads, hidden, layers, tp, pp, gpus, batch, tflops = row
    training = Training(global_batch_tokens=batch * 2048, recompute="full",
                        flash_attention=False, dropout=True)
    shape = {"dp": gpus // (tp * pp), "tp": tp, "pp": pp}
    return (_megatron_gpt(layers, hidden, heads), cluster("a100-80gb", gpus), training, shape,
            tflops * 1e12 / A100_PEAK)


@pytest.mark.parametrize("row", [
    pytest.param(row, id=f"{row[0]}B", marks=[pytest.mark.xfail(reason=SMALL_GEMMS, strict=True)]
                 if row[2] <= 4096 else []) for row in MEGATRON_TABLE_1])
def test_megatron_table_1_flops_per_gpu_within_15_percent(row: tuple) -> None:
    """Narayanan et al. 2021, Table 1: the published layout's hardware FLOP/s per GPU
    (recomputation counted, as their eq. 3) predicted within 15 %."""
    model, net, training, shape, published = _megatron_case(row)
    q = with_layout(model, net, training, **shape)
    assert q.fits, q.binding
    assert _close(q.hfu, published, 0.15), (q.hfu, published, q.layout.label())


@pytest.mark.xfail(strict=True, reason=(
    "the planner hides ZeRO-3's per-microbatch gathers behind compute, so pure ZeRO-3 data "
    "parallelism ranks above PTD-P; Narayanan et al.'s own Table 2 measures ZeRO-3 at 44 "
    "TFLOP/s on 1536 GPUs (mb 1) where PTD-P reaches 141: overlap at that scale is far from "
    "perfect, which this model does not represent"))
def test_megatron_1t_layout_is_among_the_best() -> None:
    """Narayanan et al. 2021, Table 1: 1T on 3072 A100s as DP 6 x TP 8 x PP 64."""
    model, net, training, shape, _ = _megatron_case(MEGATRON_TABLE_1[-1])
    preds = plan(model, net, training)
    best = preds[0].tokens_per_s_per_gpu
    ours = with_layout(model, net, training, **shape).tokens_per_s_per_gpu
    assert 1 <= rank_of(preds, **shape) <= 3 or ours >= 0.9 * best


# Llama Team 2024, "The Llama 3 Herd of Models", Table 4: 405B on 8,192 / 16,384 H100s,
# TP 8, CP 1, PP 16, DP 64 / 128, sequence 8,192, 16M tokens per batch, 430 / 400 TFLOP/s per
# GPU, BF16 MFU 43 % / 41 %. (The 131,072-token row uses context parallelism: not modelled.)
LLAMA_TABLE_4 = [(8192, 64, 0.43), (16384, 128, 0.41)]


@pytest.mark.parametrize("gpus, dp, mfu", LLAMA_TABLE_4, ids=["8k-gpus", "16k-gpus"])
def test_llama3_405b_layout_ranks_top_3_with_mfu_within_15_percent(gpus: int, dp: int,
                                                                    mfu: float) -> None:
    """Meta's TP 8 x PP 16 layout is among the planner's top 3 shapes; MFU within 15 %."""
    training = Training(global_batch_tokens=2048 * 8192)
    preds = plan(get_model("llama3-405b"), cluster("h100-sxm", gpus), training)
    assert 1 <= rank_of(preds, dp=dp, tp=8, pp=16) <= 3
    q = with_layout(get_model("llama3-405b"), cluster("h100-sxm", gpus), training, dp=dp, tp=8,
                    pp=16)
    assert _close(q.mfu, mfu, 0.15), (q.mfu, mfu)


def test_torchtitan_llama3_8b_on_64_a100_tokens_per_s_within_15_percent() -> None:
    """pytorch/torchtitan docs/performance.md (Llama 3 table, 64 A100 80 GB, FSDP2, local
    batch 1, selective op AC): 2,973 tokens/s per GPU (58.2 % MFU by torchtitan's count)."""
    training = Training(global_batch_tokens=64 * 8192, recompute="selective")
    q = with_layout(get_model("llama3-8b"), cluster("a100-80gb", 64), training, dp=64, tp=1,
                    pp=1, micro_batch=1, zero=3)
    assert _close(q.tokens_per_s_per_gpu, 2973, 0.15), q.tokens_per_s_per_gpu


TITAN_H100 = ("torchtitan's H100s ran at a 500 W power limit (700 W TDP) with eager kernels; "
              "the planner assumes a full-power H100 at its MAMF (prediction ~9,500 tokens/s)")


@pytest.mark.xfail(strict=True, reason=TITAN_H100)
def test_torchtitan_llama3_8b_on_8_h100_tokens_per_s() -> None:
    """torchtitan docs/performance.md, Table 1: Llama 3.1 8B, 8 H100, FSDP, local batch 2,
    selective AC: 5,762 tokens/s per GPU, 82.4 GiB."""
    training = Training(global_batch_tokens=16 * 8192, recompute="selective")
    q = with_layout(get_model("llama3-8b"), cluster("h100-sxm", 8), training, dp=8, tp=1, pp=1,
                    micro_batch=2, zero=3)
    assert _close(q.tokens_per_s_per_gpu, 5762, 0.15)


def test_torchtitan_llama3_8b_on_8_h100_memory_within_10_percent() -> None:
    """torchtitan docs/performance.md, Table 1: 82.4 GiB per GPU (peak reserved, on Grand
    Teton's 96 GB H100s); the planner's terms give about 77 GiB."""
    training = Training(global_batch_tokens=16 * 8192, recompute="selective")
    net = replace(cluster("h100-sxm", 8), gpu=replace(GPUS["h100-sxm"], memory_bytes=96e9))
    q = with_layout(get_model("llama3-8b"), net, training, dp=8, tp=1, pp=1, micro_batch=2,
                    zero=3)
    assert _close(q.memory_bytes, 82.4 * 2**30, 0.10), q.memory_bytes / 2**30


def test_torchtitan_llama3_405b_on_512_h100_tokens_per_s() -> None:
    """torchtitan docs/performance.md, Table 5: 405B, 512 H100 (FSDP 8, TP 8, PP 8), local
    batch 32, full AC, interleaved 1F1B: 128 tokens/s per GPU, 72.7 GiB. Caveat: that run
    trains its linears in Float8 at a 500 W power cap; the planner predicts bf16 at full
    power (about 127 tokens/s): the two effects roughly cancel, so this pins the layout's
    bubble, TP and FSDP terms more than the compute rate. Its memory (63 GiB predicted vs
    72.7) is 13 % low and not asserted."""
    training = Training(global_batch_tokens=256 * 8192, recompute="full")
    q = with_layout(get_model("llama3-405b"), cluster("h100-sxm", 512), training, dp=8, tp=8,
                    pp=8)
    assert _close(q.tokens_per_s_per_gpu, 128, 0.15), q.tokens_per_s_per_gpu


# --- the seeds' memory examples ------------------------------------------------------------

def test_gpt3_weights_need_700_gb_fp32_and_350_gb_fp16() -> None:
    """Seed 001: GPT-3 175B needs ~700 GB at fp32, ~350 GB at fp16 for weights alone."""
    params = get_model("gpt3-175b").params
    assert _close(params * 4, 700e9, 0.10) and _close(params * 2, 350e9, 0.10)


def _seed_3b() -> tuple[Decoder, Cluster]:
    model = Decoder("gpt-3b", GPT_3B.layers, GPT_3B.hidden, GPT_3B.heads, GPT_3B.heads,
                    4 * GPT_3B.hidden, False, GPT_3B.vocab, 2048, bias=True,
                    learned_positions=True)
    gpu = replace(GPUS["a100-40gb"], name="24gb", memory_bytes=24e9)
    return model, Cluster(gpu, 4, 4, gpu.nvlink, gpu.nvlink)


def test_seed_3b_on_four_24gb_gpus_options_a_and_b() -> None:
    """Seed 000, example 2 / exercise 2: 3B in bf16 with Adam on 4 x 24 GB. Pure DP does not
    fit; option A (DP + ZeRO-2 + activation checkpointing) fits; option B (PP 2 x DP 2 +
    ZeRO-1) fits too with checkpointing."""
    model, net = _seed_3b()
    training = Training(global_batch_tokens=64 * 2048)
    plain = predict(model, net, training, Layout(4, 1, 1, 1, 16, zero=0, recompute="none"))
    option_a = predict(model, net, training, Layout(4, 1, 1, 1, 16, zero=2, recompute="full"))
    option_b = predict(model, net, training, Layout(2, 1, 2, 1, 32, zero=1, recompute="full"))
    assert not plain.fits and option_a.fits and option_b.fits
    assert plain.binding.startswith("out of memory")


def test_seed_320gb_model_on_80gb_nodes_keeps_tp_inside_a_node() -> None:
    """Seed 003, Level III: a model that needs about 320 GB to train (16 B/param: 20B params)
    on 8-GPU nodes of 80 GB: model states 320 GB; the best layout fits with TP inside a node."""
    model = _megatron_gpt(44, 6144, 48)  # 12 L h^2 = 19.9e9: "about 20B"
    assert _close(model.params * 16, 320e9, 0.10)
    preds = plan(model, cluster("a100-80gb", 32), Training(global_batch_tokens=512 * 2048))
    assert preds[0].fits and preds[0].layout.tp <= 8


# --- the terms themselves ------------------------------------------------------------------

def test_layer_bytes_equal_korthikanti_on_their_shape() -> None:
    """On GPT's shape with dropout and no flash attention the count is Korthikanti et al.'s
    34 + 5 a s / h (per s b h); SwiGLU and GQA change it term by term."""
    gpt = _megatron_gpt(1, 12288, 96)
    old = Training(global_batch_tokens=1, flash_attention=False, dropout=True)
    sbh = 2048 * 12288
    assert decoder_layer_bytes(gpt, old, 1, 1, "none") == pytest.approx(sbh * (34 + 80))
    llama = get_model("llama3-405b")
    per = decoder_layer_bytes(llama, Training(global_batch_tokens=1), 1, 1, "none")
    f = 53248 / 16384
    assert per == pytest.approx(8192 * 16384 * (4 + 6 + 4 / 16 + 2 + 6 * f))


def test_every_prediction_lists_its_terms_with_formula_and_source() -> None:
    """A reader sees the work: named memory and time terms, each with formula and source."""
    q = plan(get_model("llama3-8b"), cluster("h100-sxm", 64),
             Training(global_batch_tokens=2**22))[0]
    names = [t.name for t in q.memory] + [t.name for t in q.time]
    for name in ("params", "grads", "optimizer", "activations", "buffers", "compute", "tp",
                 "bubble", "p2p", "dp"):
        assert name in names
    assert all(t.formula and t.source for t in q.memory + q.time)


def test_a_tie_keeps_the_variant_that_recomputes_nothing() -> None:
    """The lesson GPT on one 8-GPU node: full recomputation lengthens the backward by as much
    communication as it then hides, so its step equals the plain one's up to float rounding;
    the planner must then recommend the plain one (lesson 13 printed "recompute full" for a
    214,400-parameter model before), and a real gain still wins."""
    from labkit.lessons.plan_lesson import lesson_decoder
    from labkit.theory.plan import fastest

    model, net = lesson_decoder(), cluster("h100-sxm", 8)
    training = Training(global_batch_tokens=64 * model.seq)
    variants = [predict(model, net, training, Layout(4, 1, 2, 16, 1, "1f1b", 1, 1, r))
                for r in ("full", "selective", "none")]
    steps = [q.step_s for q in variants]
    assert max(steps) == pytest.approx(min(steps), rel=1e-9)  # the tie this test is about
    assert fastest(variants).layout.recompute == "none"
    assert plan(model, net, training)[0].layout.recompute == "none"
    slower = replace(variants[2], tokens_per_s_per_gpu=variants[2].tokens_per_s_per_gpu * 0.99)
    assert fastest([slower, variants[0]]).layout.recompute == "full"


# --- the command ---------------------------------------------------------------------------

def test_cli_llama3_405b_on_16k_h100s_lists_tp8_pp16_in_top_3(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38's "done when": TP 8 x PP 16 among the top 3, MFU within 15 % of ~41 %."""
    code = main(["plan", "--model", "llama3-405b", "--gpus", "16384", "--gpu", "h100-sxm",
                 "--seq", "8192", "--global-batch-tokens", "16M", "--top", "3", "--json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["layouts"]
    hits = [r for r in rows if (r["layout"]["tp"], r["layout"]["pp"]) == (8, 16)]
    assert hits and _close(hits[0]["mfu"], 0.41, 0.15)


@pytest.mark.parametrize("argv, named", [
    (["--gpus", "0"], "--gpus ('0')"), (["--global-batch-tokens", "lots"], "'lots'"),
    (["--model", "gpt5"], "'gpt5'"), (["--gpu", "v100"], "'v100'"),
    (["--recompute", "some"], "'some'")])
def test_cli_bad_input_names_the_value_and_exits_2(argv: list[str], named: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "e.g." in err
