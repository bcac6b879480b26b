"""Quiz questions: long sequences and many experts (lesson 14).

Activation memory per layer (Korthikanti et al. 2022, eqs. 2-3:
``theory.layer_activation_bytes``); sequence parallelism's traffic (an all-reduce is a
reduce-scatter plus an all-gather); ring attention's K/V blocks and zig-zag chunks
(``theory.context``; Liu et al. 2023); an MoE layer's capacity (Fedus et al. 2021,
``theory.experts.expert_capacity``).
"""

from __future__ import annotations

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question
from labkit.theory import layer_activation_bytes
from labkit.theory.context import rank_chunks, ring_kv_block_bytes
from labkit.theory.experts import expert_capacity

SEQ = Concept.LONG_SEQUENCES
LESSON = "14_long_sequences_and_experts"

QUESTIONS: list[Question] = [
    NumericQuestion(
        "seq-01", SEQ,
        "Korthikanti et al. count one transformer layer's activations (16-bit, batch 1) as "
        "s*h*(10 + 24/t + 5*a*s/(h*t)) bytes with tensor parallelism over t GPUs, and "
        "s*h/t*(34 + 5*a*s/h) with sequence parallelism as well. For s = {s}, h = {h}, "
        "a = {a}, t = {t}: how many GB per GPU does sequence parallelism save per layer?",
        grid={"s": (2048, 4096, 8192), "h": (4096, 8192, 12288), "a": (32, 64, 96),
              "t": (2, 4, 8)},
        compute=lambda s, h, a, t: (layer_activation_bytes(s, 1, h, a, tp=t)
                                    - layer_activation_bytes(s, 1, h, a, tp=t,
                                                             sequence_parallel=True)) / 1e9,
        explanation="The regions TP leaves whole keep 10*s*h bytes on every GPU; SP splits "
        "them too: 10*{s}*{h}*(1 - 1/{t}) = {answer} GB. The attention scores are split by "
        "TP already, so they do not change.", lesson=LESSON),
    NumericQuestion(
        "seq-02", SEQ,
        "Ring attention over cp = {cp} ranks, sequence {s} tokens, batch 1, {kv} key/value "
        "heads of dimension 128 in bf16: how many MB does one rank pass to its neighbour at "
        "each ring step of one layer's forward (the K block and the V block)?",
        grid={"cp": (4, 8, 16), "s": (32768, 65536, 131072), "kv": (1, 8)},
        compute=lambda cp, s, kv: ring_kv_block_bytes(1, s, kv, 128, cp, 2) / 1e6,
        explanation="Each rank holds s/cp = {s}/{cp} tokens; K and V are 2 x (s/cp) x {kv} "
        "x 128 values of 2 bytes: {answer} MB, sent cp - 1 times a forward while the rank "
        "computes with the block it holds.", lesson=LESSON),
    NumericQuestion(
        "seq-03", SEQ,
        "Zig-zag context parallelism cuts the sequence into 2 x cp chunks and gives rank i "
        "chunk i and one more. With cp = {cp}, which other chunk (counting from 0) does rank "
        "{r} hold?",
        grid={"cp": (2, 4, 8), "r": (0, 1, 3)},
        compute=lambda cp, r: rank_chunks(r, cp, zigzag=True)[1],
        valid=lambda cp, r: r < cp,
        explanation="Chunk 2cp - 1 - i = {answer}: one early and one late chunk, so under a "
        "causal mask every rank has the same work at every ring step.", integer=True,
        lesson=LESSON),
    NumericQuestion(
        "seq-04", SEQ,
        "An MoE layer routes {tokens} tokens of a rank to their top-{k} of {e} experts with "
        "capacity factor {cf}. How many assignments may one expert take "
        "(ceil(capacity_factor x tokens x k / experts))?",
        grid={"tokens": (512, 1024, 4096), "k": (1, 2), "e": (8, 16, 64), "cf": (1.0, 1.25)},
        compute=lambda tokens, k, e, cf: expert_capacity(tokens, e, cf, k),
        explanation="ceil({cf} x {tokens} x {k} / {e}) = {answer}; an expert's assignments "
        "past that are dropped and the token skips the layer.", integer=True, lesson=LESSON),
    ChoiceQuestion(
        "seq-05", SEQ,
        "Sequence parallelism replaces tensor parallelism's all-reduce by an all-gather before "
        "the column-parallel linear and a reduce-scatter after the row-parallel one. What does "
        "that do to the activation bytes each GPU sends?",
        "Nothing: a ring all-reduce is itself a reduce-scatter plus an all-gather",
        ("It halves them, since each GPU now holds half the sequence",
         "It doubles them, since there are two collectives instead of one",
         "It removes them in the forward pass and keeps them in the backward pass"),
        "Each of the two sends (t-1)/t of the activation, 2(t-1)/t in all: exactly the "
        "all-reduce's bytes. What SP adds is small: a gather where the sequence enters and "
        "leaves the split, and summing the LayerNorm gradients over the group.",
        lesson=LESSON),
]
