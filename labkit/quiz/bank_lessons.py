"""Quiz questions on the lessons' remaining topics: the lab itself, LARS / LAMB, SyncBN,
the seeds' own memory numbers, offloading, and cheaper gradients (random-k, int8).

Sources: You et al. 2017 (LARS) and 2019 (LAMB), ``theory.lars_local_lr``; Ioffe and
Szegedy 2015 and PyTorch's SyncBatchNorm for BatchNorm under data parallelism (seed 000's
common mistake); seed 003's "7B needs about 126 GB" (``theory.bytes_per_param`` with fp32
gradients: 18 B/param), seed 001's GPT-3 "700 GB at FP32, 350 GB at FP16" and its ZeRO
"8x / 16x" against the paper's 4x / 8x (``theory.zero_memory``); ZeRO-Offload (Ren et al.
2021, ``offload_optimizer``); seed 002's random-k and quantised gradients.
"""

from __future__ import annotations

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question
from labkit.theory import bytes_per_param, lars_local_lr, zero_memory

DP, LR, MEM, COMM = (Concept.DATA_PARALLEL, Concept.BATCH_LR, Concept.MEMORY_ZERO,
                     Concept.COMMUNICATION)


def _reduction(dp: int, stage: int) -> float:
    return zero_memory(1e9, dp, 0)["total"] / zero_memory(1e9, dp, stage)["total"]


QUESTIONS: list[Question] = [
    # ------------------------------------------------------------ the lab (lesson 00)
    ChoiceQuestion(
        "lab-01", DP,
        "labkit.run(strategy='ddp', world_size=4) starts four ranks. What is a rank?",
        "One process with its own copy of the code, numbered 0 to world_size - 1",
        ("One thread inside the notebook's own Python process, sharing its memory and its model",
         "One GPU shared by all four copies of the model",
         "One layer of the model, placed on its own device"),
        "Distributed training is N independent processes running the same program, each "
        "knowing its rank and the world size; they meet only through collectives. labkit "
        "starts them as real processes (gloo on CPU, NCCL with one GPU each).",
        lesson="00_welcome"),
    ChoiceQuestion(
        "lab-02", DP,
        "Why does labkit align every rank's clock at a barrier before recording a timeline?",
        "So all ranks' spans share one time axis and waits line up across rows",
        ("So the barrier makes the ranks compute faster afterwards",
         "Because gloo refuses to start any collective until the host clocks of all ranks agree",
         "So the trace file is smaller"),
        "Each rank measures its spans with its own monotonic clock. Subtracting the moment "
        "every rank left the same barrier puts them on one axis, so a send on one row and the "
        "matching receive on another can be compared; that is what makes waits visible.",
        lesson="00_welcome"),
    ChoiceQuestion(
        "lab-03", DP,
        "On a labkit timeline, a rank's compute row and comm row are busy at the same time. "
        "What does that show?",
        "Overlap: communication hidden behind computation",
        ("A bug: a rank cannot compute and communicate at once",
         "The rank is idle, waiting for its neighbour",
         "Two ranks accidentally share one process"),
        "Asynchronous collectives (DDP's bucket all-reduces) run while the backward pass keeps "
        "computing. Time where both rows are busy costs nothing extra; only communication "
        "outside compute (exposed) lengthens the step.",
        lesson="00_welcome"),
    # ------------------------------------------------------------ SyncBatchNorm, Amdahl
    ChoiceQuestion(
        "syncbn-01", DP,
        "A CNN with BatchNorm trains data-parallel with a small per-GPU batch, and results "
        "differ from rank to rank. What fixes it?",
        "SyncBatchNorm (statistics all-reduced over ranks) or GroupNorm (no batch statistics)",
        ("A larger learning rate on rank 0 only",
         "Broadcasting rank 0's weights to every other rank after each optimizer step, "
         "in place of the all-reduce",
         "Turning off the gradient all-reduce for BatchNorm layers"),
        "BatchNorm normalises with the mean and variance of the batch it sees; under data "
        "parallelism each rank sees only its shard, so statistics (and running averages) "
        "drift apart. SyncBN all-reduces the sums of x and x squared so every rank normalises "
        "with the global batch; GroupNorm and LayerNorm use no batch statistics at all."),
    NumericQuestion(
        "amdahl-06", Concept.SCALING,
        "Data parallelism gives {speedup}x on {n} GPUs. If Amdahl's law explains all of the "
        "loss, what share of the work is parallel? Answer as a fraction (3 significant "
        "figures).",
        grid={"speedup": (6, 3, 12), "n": (8, 4, 16)},
        compute=lambda speedup, n: (1 - 1 / speedup) / (1 - 1 / n),
        valid=lambda speedup, n: speedup < n,
        explanation="From S = 1 / ((1 - f) + f / n): f = (1 - 1/S) / (1 - 1/n) = {answer}. "
        "Seed 003's 8 GPUs for 6x is a parallel share of about 0.952: the serial share is "
        "the all-reduce time compute does not hide, so overlap and fewer bytes raise f.",
        worked={"speedup": 6, "n": 8}),
    # ------------------------------------------------------------ LARS / LAMB (lesson 02)
    NumericQuestion(
        "lars-01", LR,
        "LARS scales each layer's step by a trust ratio. A layer has weight norm {w}, gradient "
        "norm {g}, trust coefficient eta = {eta} and no weight decay; the global LR is {lr}. "
        "What learning rate does this layer actually get? (3 significant figures.)",
        grid={"w": (2.0, 8.0, 30.0), "g": (0.05, 0.5, 4.0), "eta": (0.001, 0.01),
              "lr": (1.0, 8.0)},
        compute=lambda w, g, eta, lr: lars_local_lr(lr, w, g, eta=eta),
        explanation="lr x eta x ||w|| / ||g|| = {lr} x {eta} x {w} / {g} = {answer}. Layers whose "
        "gradients are large relative to their weights take smaller steps, so one huge global "
        "LR (large batches) does not blow up any single layer."),
    ChoiceQuestion(
        "lamb-01", LR,
        "What is LAMB, compared with LARS?",
        "Adam's update with LARS's layer-wise trust ratio applied to it",
        ("LARS with the momentum removed and the trust ratio computed once per model, not per layer",
         "SGD with a learning rate that decays per layer",
         "A warmup schedule for LARS"),
        "LAMB (You et al. 2019) computes Adam's update (moments, bias correction, weight "
        "decay) and rescales it per layer by ||w|| / ||update||; it trained BERT at batch 32k. "
        "LARS applies the ratio to the momentum-SGD gradient instead."),
    # ------------------------------------------------------------ the seeds' memory numbers
    NumericQuestion(
        "mem-seed-01", MEM,
        "Many frameworks keep fp32 gradients under mixed precision: 2 B weights + 4 B "
        "gradients + 12 B optimizer state = 18 B per parameter. How many GB does training a "
        "{params_b}B-parameter model take by that count (model states only)?",
        grid={"params_b": (1.3, 7, 13, 70)},
        compute=lambda params_b: params_b * 1e9 * bytes_per_param(fp32_grads=True)["total"] / 1e9,
        explanation="{params_b}e9 x 18 B = {answer} GB. This is seed 003's 'a 7B model needs "
        "about 126 GB': 18 B/param, not its own 16 B rule (which gives 112 GB); DeepSpeed's "
        "memory estimators count 18 too.",
        unit="GB", worked={"params_b": 7}),
    NumericQuestion(
        "mem-seed-02", MEM,
        "GPT-3 has 175B parameters. How many GB do its weights alone take at {precision}?",
        grid={"precision": ("fp32", "fp16")},
        compute=lambda precision: 175e9 * (4 if precision == "fp32" else 2) / 1e9,
        explanation="175e9 x {bytes} B = {answer} GB: seed 001's 700 GB (fp32) and 350 GB "
        "(fp16), before gradients, optimizer state and activations.",
        unit="GB", derive=lambda precision: {"bytes": 4 if precision == "fp32" else 2}),
    NumericQuestion(
        "zero-05", MEM,
        "By the ZeRO paper's count (mixed-precision Adam, K = 12), how many times less "
        "model-state memory per GPU does ZeRO-{stage} need than plain data parallelism on "
        "{dp} GPUs? (3 significant figures.)",
        grid={"stage": (1, 2), "dp": (8, 16, 64)},
        compute=_reduction,
        explanation="16 / (4 + 12/{dp}) for stage 1, 16 / (2 + 14/{dp}) for stage 2: {answer}x. "
        "At 64 GPUs that is 3.82x and 7.21x; the paper rounds to 4x and 8x for large N, and "
        "seed 001's '8x / 16x' overstates both.",
        unit="x"),
    NumericQuestion(
        "offload-01", MEM,
        "ZeRO-3 shards a {params_b}B mixed-precision Adam model over {dp} GPUs, with DeepSpeed's "
        "offload_optimizer moving the optimizer state to CPU memory. How many GB of model "
        "state stay on each GPU?",
        grid={"params_b": (7, 13, 70), "dp": (8, 16, 64)},
        compute=lambda params_b, dp:
            zero_memory(params_b * 1e9, dp, 3, offload_optimizer=True)["total"] / 1e9,
        explanation="ZeRO-3 leaves (2 + 2 + 12) / {dp} B per parameter on each GPU; offloading "
        "moves the 12 B of optimizer state to the host: 4 / {dp} x {params_b}e9 = {answer} GB. "
        "The price: each step ships gradient and parameter shards over PCIe and runs Adam on "
        "the CPU.",
        unit="GB"),
    # ------------------------------------------------------------ cheaper gradients (06)
    NumericQuestion(
        "compress-01", COMM,
        "A {numel_m}M-value gradient is all-reduced as {method}. How many MB is its payload?",
        grid={"numel_m": (10, 25, 100), "method": ("fp32", "fp16", "int8")},
        compute=lambda numel_m, method: numel_m * {"fp32": 4, "fp16": 2, "int8": 1}[method],
        explanation="{numel_m}M values x {bytes} B = {answer} MB. 8-bit quantisation sends a "
        "quarter of fp32 (plus a scale per bucket), at the price of rounding error that error "
        "feedback carries into the next step.",
        unit="MB",
        derive=lambda numel_m, method: {"bytes": {"fp32": 4, "fp16": 2, "int8": 1}[method]}),
    ChoiceQuestion(
        "compress-02", COMM,
        "Random-k sends k randomly chosen gradient values; top-k sends the k largest. What "
        "does random-k do better, and worse?",
        "Cheaper to pick, and the positions come from a shared seed; but it is noisier",
        ("It always converges faster than top-k, since over many steps every single "
         "gradient value gets sent eventually",
         "It sends fewer bytes than top-k for the same k",
         "It needs no error feedback, because it is unbiased per step"),
        "Top-k must find the largest magnitudes and send their indices; random-k draws "
        "positions from a seed all ranks share, so only values travel, and it is unbiased once "
        "scaled. But random values carry less of the gradient than the largest ones, so it is "
        "noisier; with error feedback both converge."),
]
