"""Quiz questions: pipeline parallelism (bubbles, schedules, balance) and tensor parallelism.

Follows GPipe (Huang et al. 2019) for the bubble, Narayanan et al. 2021 for 1F1B and the
interleaved schedule, Megatron-LM (Shoeybi et al. 2019) for column/row-parallel layers,
and the book chapter's stage-imbalance story (about 1.2x -> 3.4x on four GPUs). Numeric
keys come from ``labkit.theory.pipeline``; the bubble is stated as a share of the total
step time or relative to the ideal compute time, and each prompt says which.
"""

from __future__ import annotations

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question
from labkit.theory import bubble_fraction

PP, TP = Concept.PIPELINE, Concept.TENSOR_PARALLEL


def _slots(stages: int, microbatches: int, virtual: int = 1) -> dict[str, int]:
    return {"idle": stages - 1, "slots": virtual * microbatches,
            "span": virtual * microbatches + stages - 1}


QUESTIONS: list[Question] = [
    # ------------------------------------------------------------ pipeline parallelism
    NumericQuestion(
        "pipeline-01", PP,
        "A GPipe pipeline has {stages} equally fast stages and splits each batch into "
        "{microbatches} micro-batch(es). What share of the total step time does a stage spend "
        "idle in the bubble? Answer as a fraction, e.g. 0.25 (3 significant figures are "
        "enough).",
        grid={"stages": (2, 4, 8), "microbatches": (1, 4, 8, 16, 32)},
        compute=lambda stages, microbatches:
            bubble_fraction(stages, microbatches, "gpipe", relative_to="total"),
        explanation="Filling and draining the pipe costs p - 1 = {idle} idle slots per stage, out "
        "of m + p - 1 = {span} slots in the step: {idle} / {span} = {answer}. More micro-batches "
        "shrink the share; with one micro-batch only one stage works at a time.",
        derive=_slots),
    NumericQuestion(
        "pipeline-02", PP,
        "A 1F1B pipeline has {stages} equally fast stages and {microbatches} micro-batches. "
        "How large is the bubble relative to the ideal, bubble-free compute time? Answer as "
        "a fraction, e.g. 0.25.",
        grid={"stages": (2, 4, 8), "microbatches": (4, 8, 16, 32)},
        compute=lambda stages, microbatches:
            bubble_fraction(stages, microbatches, "1f1b", relative_to="ideal"),
        explanation="Relative to the useful work the bubble is (p - 1) / m = {idle} / "
        "{microbatches} = {answer}. 1F1B reorders work to save activation memory but keeps "
        "GPipe's bubble; halving it needs twice the micro-batches (or interleaving).",
        derive=_slots),
    NumericQuestion(
        "pipeline-03", PP,
        "An interleaved 1F1B pipeline runs on {stages} GPUs, each holding {virtual} model "
        "chunks, with {microbatches} micro-batches per batch. What share of the total step "
        "time is bubble? Answer as a fraction (3 significant figures are enough).",
        grid={"stages": (4, 8), "microbatches": (8, 16), "virtual": (2, 4)},
        compute=lambda stages, microbatches, virtual:
            bubble_fraction(stages, microbatches, "interleaved", virtual=virtual,
                            relative_to="total"),
        explanation="With v = {virtual} chunks per GPU each slot is 1/v of a stage's work, "
        "so a step has v x m = {slots} useful slots and still p - 1 = {idle} idle ones: "
        "{idle} / {span} = {answer}. Interleaving divides the bubble by about v, paid for with "
        "v times as many messages between GPUs.",
        derive=_slots),
    ChoiceQuestion(
        "pipeline-04", PP,
        "A team gives each of 4 GPUs 8 of a transformer's 32 layers. Throughput is barely "
        "better than 1 GPU, and profiling shows one GPU at 100% while the others idle. Why?",
        "The slowest stage sets the pace; balance by measured time, not layer count",
        ("4 stages are too few; a pipeline needs at least 8 stages to overlap work",
         "Activations sent between stages saturate the interconnect between GPUs",
         "The pipeline also needs data-parallel replicas before it can speed anything up"),
        "Every micro-batch must pass through every stage, so the pipeline produces one result "
        "per slowest-stage time and the faster stages wait. Equal layer counts are not equal "
        "work: embeddings, heads and dense blocks cost very different amounts. Balancing by "
        "measured time plus more micro-batches took such a setup from about 1.2x to 3.4x."),
    ChoiceQuestion(
        "pipeline-05", PP,
        "Compared with GPipe (all forwards, then all backwards), what does the 1F1B schedule "
        "improve?",
        "Activation memory: a stage holds about p micro-batches, not all m",
        ("The bubble: 1F1B removes the fill and drain phases entirely",
         "Traffic: it halves the number of messages sent between stages",
         "Latency: a stage can start before the previous stage's activations arrive"),
        "GPipe runs every forward first, so each stage keeps the activations of all m "
        "micro-batches until the backwards begin. 1F1B starts a backward as soon as the pipe "
        "is full and then alternates, so the first stage holds about p micro-batches and the "
        "last only one. The fill and drain, and so the bubble, are unchanged."),
    # ------------------------------------------------------------ tensor parallelism
    ChoiceQuestion(
        "tp-01", TP,
        "In a cluster of 8-GPU nodes (NVLink inside a node, InfiniBand between nodes), where "
        "does each kind of model parallelism usually go?",
        "Tensor parallelism inside a node; pipeline parallelism across nodes",
        ("Pipeline parallelism inside a node; tensor parallelism across nodes",
         "Both across nodes, to spread the memory",
         "Tensor parallelism across nodes, because InfiniBand has lower latency"),
        "Tensor parallelism communicates inside every layer, in the forward and the backward "
        "pass, so it needs the fastest links. A pipeline only passes activations between "
        "neighbouring stages, little traffic that tolerates a slower network. 3D parallelism "
        "adds data parallelism on top."),
    ChoiceQuestion(
        "tp-02", TP,
        "In a Megatron-style MLP block the first linear layer is split by columns and the "
        "second by rows across the tensor-parallel GPUs. How many all-reduces does the "
        "block's forward pass need?",
        "One, after the row-parallel layer",
        ("Two, one after each linear layer",
         "None: each GPU ends with a complete output",
         "One all-gather after the column-parallel layer"),
        "Splitting the first weight by columns gives each GPU a slice of the hidden "
        "activations, and the element-wise GeLU can run on that slice directly. The row-"
        "parallel second layer then produces partial sums of the full output, which one "
        "all-reduce adds up. The backward pass needs one all-reduce at the block's input."),
    ChoiceQuestion(
        "tp-03", TP,
        "Naive model parallelism puts the first half of the layers on GPU 0 and the second "
        "half on GPU 1, with no micro-batches. Why is utilisation poor?",
        "Only one GPU computes at a time; each waits for the other's half",
        ("Both GPUs end up computing every layer twice, forward and backward",
         "The GPUs must all-reduce the gradients after every single layer",
         "All of the weights are copied between the two GPUs every step"),
        "The second GPU needs the first one's output and the first needs the second one's "
        "gradients, so they take turns and utilisation is about 1/k for k GPUs. Pipelining "
        "with micro-batches overlaps them; tensor parallelism splits each layer so all GPUs "
        "work on the same layer at once."),
    ChoiceQuestion(
        "tp-04", TP,
        "Compared with pipeline parallelism, what is characteristic of tensor parallelism?",
        "No bubble, but a collective inside every layer, so it needs fast links",
        ("A larger bubble than pipelining, but much lighter communication",
         "No communication at all in the forward pass, only in backward",
         "It shards only the optimizer state, leaving every weight replicated"),
        "Every tensor-parallel GPU works on every layer of every micro-batch, so nobody waits "
        "for a pipe to fill. In exchange each layer ends with a collective over activations, "
        "many per step, on the critical path. Over NVLink that is affordable; over a slower "
        "network it dominates."),
]
