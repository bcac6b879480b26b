"""Quiz questions: planning a run at scale (lesson 13, ``labkit.theory.plan``).

Follows the planner's own terms: model state per GPU from ``zero_memory`` (16 bytes per
parameter with bf16 and Adam, Rajbhandari et al. 2020), MFU as PaLM defines it (Chowdhery et
al. 2022: ``6 N`` FLOPs per token over the peak), the interleaved bubble of Narayanan et al.
2021, and Llama 3 405B's published layout (Llama Team 2024, Table 4: TP 8, PP 16 on
16,384 H100s). Numeric keys come from ``labkit.theory``.
"""

from __future__ import annotations

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question
from labkit.theory import bubble_fraction
from labkit.theory.memory import zero_memory

LESSON = "13_laptop_to_cluster"
THREE_D = Concept.THREE_D


def _state_gb(billions: int, tp: int, pp: int, dp: int, zero: int) -> float:
    return zero_memory(billions * 1e9 / (tp * pp), dp, zero)["total"] / 1e9


def _mfu_percent(billions: int, tokens_k: int, peak_tflops: int) -> float:
    return 100 * 6 * billions * 1e9 * tokens_k * 1e3 / (peak_tflops * 1e12)


QUESTIONS: list[Question] = [
    NumericQuestion(
        "plan-01", THREE_D,
        "A model of {billions}B parameters trains in bf16 with Adam on TP {tp} x PP {pp} x DP {dp} "
        "GPUs with ZeRO-{zero} on the data axis. Ignoring activations and the uneven "
        "embedding, how many GB of model state does each GPU hold? (1 GB = 1e9 bytes.)",
        grid={"billions": (8, 70, 405), "tp": (4, 8), "pp": (1, 4, 16), "dp": (8, 64),
              "zero": (0, 1)},
        compute=_state_gb, unit="GB",
        explanation="TP x PP = {tp} x {pp} GPUs share the parameters, so each holds "
        "{billions}e9 / {share} of them; bf16 weights and gradients take 2 + 2 bytes each, "
        "Adam's fp32 copy and two moments 12 bytes, {sharded}: {answer} GB.",
        derive=lambda billions, tp, pp, dp, zero: {
            "share": tp * pp, "sharded": f"divided by dp = {dp} under ZeRO-1" if zero
            else "kept whole on every replica under ZeRO-0"}, lesson=LESSON),
    NumericQuestion(
        "plan-02", THREE_D,
        "A dense model of {billions}B parameters trains at {tokens_k},000 tokens per second per GPU "
        "on GPUs with a {peak_tflops} TFLOP/s bf16 peak. What is its model FLOPs utilisation, "
        "in percent? (Count 6 N FLOPs per token; ignore attention.)",
        grid={"billions": (8, 70), "tokens_k": (1, 2, 4), "peak_tflops": (312, 989)},
        compute=_mfu_percent, unit="%",
        valid=lambda billions, tokens_k, peak_tflops: _mfu_percent(billions, tokens_k,
                                                                   peak_tflops) < 100,
        explanation="6 x {billions}e9 x {tokens_k}e3 FLOP/s of model work per GPU, over "
        "{peak_tflops}e12: {answer} %. MFU counts only the model's FLOPs; recomputation "
        "raises the hardware's utilisation (HFU), not MFU.", lesson=LESSON),
    NumericQuestion(
        "plan-03", THREE_D,
        "Meta's Llama 3 405B layout has PP 16 with the interleaved schedule, {virtual} model "
        "chunks per GPU and {microbatches} microbatches per step. What share of the step "
        "does the bubble take? Answer as a fraction (3 significant figures).",
        grid={"virtual": (2, 4, 8), "microbatches": (16, 32, 64)},
        compute=lambda virtual, microbatches: bubble_fraction(
            16, microbatches, "interleaved", virtual=virtual, relative_to="total"),
        explanation="p - 1 = 15 idle slots of 1/v of a stage each, against v x m useful "
        "slots: 15 / (15 + {virtual} x {microbatches}) = {answer}.", lesson=LESSON),
    ChoiceQuestion(
        "plan-04", THREE_D,
        "On 8-GPU H100 nodes, why does the planner rank TP 16 below TP 8 for Llama 3 405B?",
        "Its group spans two nodes, so per-layer collectives cross InfiniBand",
        ("TP 16 does not divide Llama 3 405B's 128 attention heads evenly, so some GPUs idle",
         "TP 16 needs more memory per GPU than TP 8, because every GPU keeps more activations",
         "TP 16 doubles the pipeline bubble, because the schedule needs twice the stages"),
        "A tensor-parallel group issues 4 collectives per layer per microbatch and nothing "
        "computes while they run. Within a node they ride NVLink (450 GB/s per direction); a "
        "group of 16 sends them between nodes at an NDR NIC's 50 GB/s. 128 heads split "
        "16 ways, and TP 16 holds less per GPU, not more.", lesson=LESSON),
    ChoiceQuestion(
        "plan-05", THREE_D,
        "A 214,000-parameter GPT is planned on 1,024 H100s. Every layout's MFU is far below "
        "1 %. What binds it?",
        "Message latency: microseconds of compute against a fixed cost per message",
        ("Memory: with 1,024 replicas the optimizer states no longer fit in 80 GB per GPU",
         "The pipeline bubble, since the planner must cut the model into 64 stages",
         "The H100's fp32 peak, which a small model trained in fp32 cannot exceed"),
        "A tiny model gives each GPU almost nothing to multiply, while every collective still "
        "pays its link's latency. Parallelism pays off only when compute per GPU outweighs the "
        "messages; lesson 13 printed the binding term of the best layout.", lesson=LESSON),
    ChoiceQuestion(
        "plan-06", THREE_D,
        "Seed 000: a 3B model, bf16 and Adam, on 4 x 24 GB GPUs. Pure data parallelism does "
        "not fit. Why does ZeRO-2 with activation checkpointing (option A) fit?",
        "Gradients and Adam's states are sharded 4 ways; checkpointing keeps layer inputs",
        ("ZeRO-2 shards the weights 4 ways as well, so each GPU holds only 0.75B parameters",
         "Checkpointing moves the optimizer states to CPU memory between optimizer steps",
         "ZeRO-2 stores every term in fp8, which halves the bytes of each of the four terms"),
        "16 bytes x 3e9 = 48 GB do not fit in 24 GB. ZeRO-2 keeps the 2-byte weights whole "
        "(6 GB) and divides gradients and Adam's 12 bytes by 4 (10.5 GB); full checkpointing "
        "keeps 2 s b h bytes per layer instead of dozens. The weights stay whole until ZeRO-3.",
        lesson=LESSON),
]
