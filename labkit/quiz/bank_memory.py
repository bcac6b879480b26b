"""Quiz questions: mixed precision, memory and ZeRO sharding, checkpointing and faults.

Follows the ZeRO paper's accounting of model states (Rajbhandari et al. 2020: 16 bytes
per parameter for mixed-precision Adam), the seed lesson's 3B-parameter / 4 x 24 GB
example, and its checkpointing checklist. Numeric keys come from ``labkit.theory.memory``.
"""

from __future__ import annotations

from typing import Any

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question, format_number
from labkit.theory import bytes_per_param, zero_memory

AMP, ZERO, CKPT = Concept.MIXED_PRECISION, Concept.MEMORY_ZERO, Concept.FAULT_TOLERANCE

_PRECISION = {"mixed": "mixed precision (bf16 compute, fp32 master weights)",
              "fp32": "plain fp32"}
_OPTIMIZER = {"adam": "Adam", "momentum": "SGD with momentum", "sgd": "plain SGD (no momentum)"}
_SHARDED = {0: "nothing (plain DDP: every rank holds everything)",
            1: "the optimizer state", 2: "the optimizer state and the gradients",
            3: "the optimizer state, the gradients and the parameters"}


def _bytes_parts(precision: str, optimizer: str) -> dict[str, Any]:
    parts = bytes_per_param(precision, optimizer)
    return {"precision_text": _PRECISION[precision], "optimizer_text": _OPTIMIZER[optimizer],
            "p": parts["params"], "g": parts["grads"], "o": parts["optimizer"]}


def _zero_parts(params: float, dp: int, stage: int) -> dict[str, Any]:
    parts = zero_memory(params, dp, stage)
    return {"billions": format_number(params / 1e9), "what": _SHARDED[stage],
            **{f"{k}_gb": format_number(v / 1e9) for k, v in parts.items()}}


QUESTIONS: list[Question] = [
    # ------------------------------------------------------------ mixed precision
    NumericQuestion(
        "amp-01", AMP,
        "You train with {precision_text} and the {optimizer_text} optimizer. How many bytes "
        "of model state (parameter + gradient + optimizer state) does each parameter cost, "
        "before activations?",
        grid={"precision": ("mixed", "fp32"), "optimizer": ("adam", "momentum", "sgd")},
        compute=lambda precision, optimizer: bytes_per_param(precision, optimizer)["total"],
        explanation="{p} bytes for the working weight + {g} for its gradient + {o} for the "
        "optimizer state = {answer} bytes. Under mixed precision the optimizer state includes "
        "the 4-byte fp32 master copy of each weight, so Adam costs 16 bytes per parameter with "
        "or without mixed precision; what bf16 saves is activation memory and bandwidth.",
        unit="bytes", integer=True, derive=_bytes_parts),
    ChoiceQuestion(
        "amp-02", AMP,
        "Why does fp16 mixed-precision training multiply the loss by a large scale factor "
        "before calling backward()?",
        "Small gradients would underflow to zero in fp16",
        ("To raise the effective learning rate without touching the optimizer's settings",
         "fp16 cannot hold large values, so the loss has to be scaled down before backward",
         "To undo the division by the world size that the gradient all-reduce applies"),
        "fp16 has a narrow exponent range: gradients below about 6e-8 become 0. Multiplying "
        "the loss multiplies every gradient, keeping them representable; the scaler divides "
        "them back before the update and skips steps that overflowed. bf16 keeps fp32's "
        "exponent range, which is why bf16 training usually needs no loss scaling."),
    ChoiceQuestion(
        "amp-03", AMP,
        "Mixed-precision training computes in bf16 but keeps an fp32 master copy of the "
        "weights. Why keep the fp32 copy?",
        "Small updates would round away when added to a 16-bit weight",
        ("GPUs cannot multiply matrices in 16-bit, so the weights must be fp32 at compute time",
         "The gradient all-reduce in NCCL only accepts fp32 tensors as input",
         "It is a backup copy of the model in case a rank fails in the middle of a step"),
        "A 16-bit float has only 8 (bf16) or 11 (fp16) bits of precision, so adding an update "
        "a thousand times smaller than the weight leaves the weight unchanged. The optimizer "
        "applies updates to the fp32 copy, where they accumulate, and casts it back to 16-bit "
        "for the next forward pass. That copy is part of the 16 bytes per parameter."),
    ChoiceQuestion(
        "amp-04", AMP,
        "You switch the gradients that DDP all-reduces from fp32 to bf16. What happens to "
        "the communication?",
        "Half the bytes on the wire, so about half the time when bandwidth-bound",
        ("Nothing changes: NCCL always upcasts the buffers and sends all-reduce traffic in fp32",
         "The bytes drop to a quarter, since bf16 also compresses the exponent",
         "The ring needs twice as many steps so that no precision is lost"),
        "bf16 stores a value in 2 bytes instead of 4, so every chunk the ring passes around is "
        "half the size. Mixed precision helps twice: faster matrix multiplies on tensor cores "
        "and half the gradient traffic on the interconnect. The number of ring steps depends "
        "only on the number of ranks."),
    # ------------------------------------------------------------ memory and ZeRO
    NumericQuestion(
        "zero-01", ZERO,
        "A {billions}B-parameter model trains with mixed-precision Adam (16 bytes of model "
        "state per parameter) on {dp} data-parallel GPUs using ZeRO stage {stage}. How many "
        "GB (1 GB = 1e9 bytes) of model state does each GPU hold? Ignore activations.",
        grid={"params": (1e9, 3e9, 7e9), "dp": (2, 4, 8), "stage": (0, 1, 2, 3)},
        compute=lambda params, dp, stage: zero_memory(params, dp, stage)["total"] / 1e9,
        explanation="Stage {stage} shards {what} across the {dp} ranks. Per GPU: parameters "
        "{params_gb} GB + gradients {grads_gb} GB + optimizer state {optimizer_gb} GB = "
        "{answer} GB. Optimizer state is 12 of the 16 bytes, which is why even stage 1 "
        "saves so much.",
        unit="GB", derive=_zero_parts),
    ChoiceQuestion(
        "zero-02", ZERO,
        "Which ZeRO stage also shards the parameters themselves, so each of N ranks keeps "
        "only 1/N of the weights between uses?",
        "Stage 3",
        ("Stage 1", "Stage 2", "Stage 0"),
        "Stage 1 shards the optimizer state, stage 2 adds the gradients, and stage 3 adds the "
        "parameters: before a layer runs, its weights are all-gathered from the shards and "
        "freed afterwards. PyTorch's FSDP with full sharding is the same idea. Stage 0 is "
        "plain DDP, with everything replicated."),
    ChoiceQuestion(
        "zero-03", ZERO,
        "A 3B-parameter model with bf16 mixed precision and Adam must train on 4 GPUs with "
        "24 GB each. Will plain data parallelism (DDP) fit?",
        "No: about 48 GB of model state per GPU; use ZeRO-2/3 and activation checkpointing",
        ("Yes: the bf16 weights take only 6 GB, far below the 24 GB per GPU",
         "Yes, provided the per-GPU batch size is reduced to 1 and activations stay small",
         "No, and the only fix is tensor parallelism across several nodes over InfiniBand"),
        "At 16 bytes per parameter, 3e9 parameters need 48 GB of weights, gradients and Adam "
        "state on every DDP rank, twice the card, before a single activation. Sharding over "
        "4 ranks cuts that to 16.5 GB (ZeRO-2) or 12 GB (ZeRO-3); activation checkpointing "
        "keeps activations small. A 2-stage pipeline with 2-way DP is the next option."),
    ChoiceQuestion(
        "zero-04", ZERO,
        "What does activation checkpointing trade?",
        "More compute for less memory: activations are recomputed in backward",
        ("Less compute for more memory: activations are cached and reused across steps",
         "Disk for GPU memory: activations are written into the training checkpoint",
         "Accuracy for speed: the stored activations are quantised to 8-bit"),
        "Backward needs the forward activations. Instead of keeping every layer's, "
        "checkpointing keeps a few and reruns the forward pieces between them when backward "
        "reaches them, typically about a third more compute for a large cut in activation "
        "memory. It has nothing to do with saving training checkpoints to disk."),
    # ------------------------------------------------------------ fault tolerance
    ChoiceQuestion(
        "ckpt-01", CKPT,
        "To resume a run exactly where it stopped, what must a checkpoint hold besides the "
        "model weights?",
        "Optimizer and scheduler state, step counters and RNG states",
        ("Nothing else: the weights alone define where the run was",
         "Only the current learning rate, so the schedule can continue from it",
         "The gradients of the last step, so the next update can be applied at once"),
        "Adam's moment estimates take thousands of steps to build; restarting them from zero "
        "causes a loss spike. Without the scheduler and step counter the warmup starts over; "
        "without RNG and sampler state the data order repeats. Gradients are recomputed every "
        "step and need not be saved."),
    ChoiceQuestion(
        "ckpt-02", CKPT,
        "In a plain DDP job, which rank should write the checkpoint file?",
        "Just rank 0 (replicas are identical); all ranks load it on restart",
        ("Every rank, each writing the same file path so no copy is missing",
         "None: DDP writes a checkpoint automatically at the end of each epoch",
         "Whichever rank has the lowest loss at the moment of saving"),
        "DDP replicas are identical, so one copy is enough; letting every rank write the same "
        "file wastes I/O and can corrupt it. The other ranks wait at a barrier so nobody "
        "moves on before the file exists. With sharded state (ZeRO-3, FSDP) no rank has "
        "everything, so each saves its own shard."),
    ChoiceQuestion(
        "ckpt-03", CKPT,
        "You checkpoint every N steps. What does a smaller N buy, and what does it cost?",
        "Less work redone after a crash, but more time spent saving",
        ("Faster training overall, with no downside except disk space",
         "Fewer crashes, at the cost of more GPU memory held for snapshots",
         "A better final model, at the cost of more files to keep track of"),
        "After a failure the run restarts from the last checkpoint, so on average about N/2 "
        "steps are redone. Checkpointing more often shrinks that loss but pauses training for "
        "each write. Pick N so the expected redo time and the checkpoint overhead are both "
        "small next to the time between failures."),
    ChoiceQuestion(
        "ckpt-04", CKPT,
        "One of 64 ranks dies mid-step in a synchronous job launched with torchrun "
        "(elastic). What happens next?",
        "The collectives stall; the whole group restarts from the last checkpoint",
        ("The other 63 ranks carry on, and the lost rank's data is skipped this epoch",
         "The lost rank's share of the step is handed to the others mid-step",
         "Only the lost rank restarts, reloads the weights and rejoins mid-step"),
        "A synchronous all-reduce needs every rank, so the survivors block and then error or "
        "time out. An elastic launcher tears the whole group down, re-forms it (possibly with "
        "fewer ranks) and every worker resumes from the last checkpoint. That is why "
        "checkpoint frequency and a tested restore matter."),
    ChoiceQuestion(
        "ckpt-05", CKPT,
        "What is the most convincing check that your checkpointing actually works?",
        "Kill a run, resume it, and compare its loss curve with an unbroken run",
        ("Check that every checkpoint file is non-empty and has a recent timestamp",
         "Load the saved weights and confirm the model's validation accuracy matches",
         "Confirm that torch.save returned without raising an error on every rank"),
        "A checkpoint can load fine and still lose state, for example a missing optimizer or "
        "scheduler, a reset data order, or a step counter that restarts warmup. Those show up "
        "only as a bump or a shift in the loss curve after resuming, so test the whole "
        "restore path the way a real failure would use it."),
]
