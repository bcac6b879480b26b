"""Quiz questions: data parallelism, sync vs async SGD, batch size and LR scaling.

Follows the seed lesson page (global batch = per-GPU batch x GPUs x accumulation, the
linear scaling rule with warmup of Goyal et al. 2017) and the book chapter's data-parallel
mental model. Numeric keys come from ``labkit.theory.batch``; the worked example
(8 GPUs x 32 x 4 -> 1024; 0.001 at 256 -> 0.004; 500-step warmup -> 0.002 at step 250)
is one variant of lr-scaling-01..03.
"""

from __future__ import annotations

import math
from typing import Any

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question, format_number
from labkit.theory import global_batch, lr_at_step, scaled_lr, warmup_lr

DP, SYNC, LR = Concept.DATA_PARALLEL, Concept.SYNC_ASYNC, Concept.BATCH_LR


def _ratios(base_batch: int, new_batch: int, **_: Any) -> dict[str, str]:
    ratio = new_batch / base_batch
    return {"ratio": format_number(ratio), "factor": format_number(math.sqrt(ratio))}


def _cosine_point(target_lr: float, warmup_steps: int, decay_steps: int,
                  frac: float) -> dict[str, int]:
    return {"step": warmup_steps + round(frac * decay_steps),
            "total_steps": warmup_steps + decay_steps}


def _cosine_lr(target_lr: float, warmup_steps: int, decay_steps: int, frac: float) -> float:
    p = _cosine_point(target_lr, warmup_steps, decay_steps, frac)
    return lr_at_step(p["step"], target_lr=target_lr, warmup_steps=warmup_steps,
                      total_steps=p["total_steps"], decay="cosine")


QUESTIONS: list[Question] = [
    # ------------------------------------------------------------ data parallelism
    ChoiceQuestion(
        "dp-01", DP,
        "In data-parallel training (PyTorch DDP), what does each rank hold, and what is "
        "different from one rank to the next?",
        "A full copy of the model and optimizer; each rank reads a different slice of the data",
        ("A different group of layers; all ranks read the same batch and pass activations along",
         "A full copy of the model; all ranks read the same batch but use different dropout masks",
         "Only the optimizer state for its shard; the parameters live on rank 0 and are broadcast"),
        "Data parallelism copies the whole model to every rank and splits the data: N "
        "processes run the same code on different samples and meet once per step to "
        "average gradients. Giving layers to different ranks is pipeline (model) "
        "parallelism; feeding every rank the same samples would just repeat the work."),
    ChoiceQuestion(
        "dp-02", DP,
        "Right after loss.backward() in DDP, every rank holds the same gradients even though "
        "each saw different samples. What made them equal?",
        "An all-reduce averaged the local gradients across all ranks",
        ("Rank 0 computed the gradient for the whole batch and broadcast it to the others",
         "The ranks saw statistically similar data, so their gradients already matched closely",
         "Each rank applied its own gradient; weights are averaged across ranks once per epoch"),
        "DDP hooks an all-reduce into the backward pass: each rank contributes its local "
        "gradient, gets back the mean, and then steps its own optimizer. Local gradients "
        "differ because the data differs; without the all-reduce the replicas would drift "
        "apart after the first step."),
    ChoiceQuestion(
        "dp-03", DP,
        "A CNN with BatchNorm trains well on 1 GPU. On 8 GPUs with 8 images per GPU, accuracy "
        "drops and the ranks disagree about the running statistics. What is the usual fix?",
        "Use SyncBatchNorm (statistics over the global batch) or GroupNorm",
        ("Multiply the learning rate by 8 to make up for the smaller per-GPU batch",
         "Exclude the BatchNorm layers from the gradient all-reduce so each rank keeps its own",
         "Give every rank the same data-shuffling seed so they all see the same images"),
        "BatchNorm normalises with the mean and variance of the batch it sees, and under "
        "DDP that is each rank's small local batch: 8 images give noisy statistics and each "
        "rank's running averages differ. SyncBatchNorm all-reduces the statistics so they "
        "cover the global batch; GroupNorm and LayerNorm do not depend on the batch at all."),
    ChoiceQuestion(
        "dp-04", DP,
        "Why must a training loop call sampler.set_epoch(epoch) on its DistributedSampler "
        "before every epoch?",
        "So every epoch gets a new shuffle that all ranks agree on",
        ("So every rank draws its own independent permutation and the shards stay random",
         "To tell the all-reduce how many steps remain in the epoch so it can prefetch",
         "Because otherwise the sampler raises StopIteration after the first epoch ends"),
        "The sampler shuffles with a seed derived from the epoch number, then hands each "
        "rank its own slice of that one permutation. Every rank must use the same "
        "permutation, or slices would overlap and some samples would be skipped; without "
        "set_epoch the seed never changes and every epoch repeats the same order."),
    # ------------------------------------------------------------ sync vs async
    ChoiceQuestion(
        "sync-01", SYNC,
        "What is the main risk of asynchronous SGD, where workers push gradients to a "
        "parameter server whenever they finish?",
        "Stale gradients, computed on weights that have since changed",
        ("Every step must wait for the slowest worker before anyone can continue",
         "It sends twice as many bytes per step as a synchronous ring all-reduce",
         "Replicas stay bit-identical, so the memory for the extra copies is wasted"),
        "In asynchronous SGD nobody waits, so by the time a slow worker's gradient arrives "
        "the weights have moved on; applying it pushes in a direction computed for an older "
        "model. Staleness grows with the number of workers and can hurt convergence. "
        "Waiting for the slowest worker is the cost of the synchronous version."),
    ChoiceQuestion(
        "sync-02", SYNC,
        "In synchronous data-parallel SGD on 16 GPUs, one GPU runs 30% slower than the rest "
        "(a straggler). What happens to the time per step?",
        "Every step waits for the straggler: about 30% slower",
        ("The other 15 carry on and apply the straggler's gradient one step later",
         "It rises by only 30% / 16, about 2%, since the delay is averaged over ranks",
         "Nothing: the all-reduce leaves the straggler out until it catches up"),
        "The gradient all-reduce is a meeting point: it cannot finish until every rank has "
        "contributed, so the fastest ranks idle until the slowest arrives. One bad GPU, a "
        "throttled node or a busy data loader slows the whole job; asynchronous SGD avoids "
        "the wait but pays with stale gradients."),
    ChoiceQuestion(
        "sync-03", SYNC,
        "Synchronous DDP replicas stay identical step after step, yet DDP never sends the "
        "weights during training. Why does that work?",
        "Same starting weights + same averaged gradient + same optimizer = same result",
        ("DDP quietly broadcasts rank 0's weights to all ranks after every optimizer step",
         "Each rank's local gradient converges to the same value once warmup has ended",
         "The all-reduce averages the weights, not the gradients, at the end of backward"),
        "DDP broadcasts the initial weights once, when the model is wrapped. After that each "
        "step gives every rank the same averaged gradient, and the same optimizer applied to "
        "the same weights and gradient gives the same result, so the copies never diverge "
        "and only gradients travel."),
    ChoiceQuestion(
        "sync-04", SYNC,
        "When can asynchronous SGD be the better choice than synchronous SGD?",
        "When workers run at uneven speeds or the network is flaky, and some staleness is fine",
        ("When results must reproduce exactly from a fixed seed, run after run on any cluster",
         "When the model does not fit in one GPU's memory, even after ZeRO sharding",
         "When you train with a very large batch and scale the learning rate linearly"),
        "Asynchronous updates keep every worker busy even when some are slow or the network "
        "hiccups, because nobody waits at a barrier. The price is stale gradients and "
        "runs that depend on timing, so they do not reproduce exactly. Memory limits call "
        "for sharding or model parallelism, not for asynchrony."),
    # ------------------------------------------------------------ batch size and LR
    NumericQuestion(
        "lr-scaling-01", LR,
        "You train on {devices} GPUs with a per-GPU batch of {per_device} and {accumulation} "
        "gradient-accumulation step(s) per optimizer step. What is the global batch size "
        "(samples per optimizer step)?",
        grid={"devices": (2, 4, 8, 16), "per_device": (16, 32, 64), "accumulation": (1, 2, 4)},
        compute=lambda devices, per_device, accumulation:
            global_batch(per_device, devices, accumulation),
        explanation="Each optimizer step consumes {per_device} samples on each of {devices} GPUs, "
        "{accumulation} time(s) over before stepping: {devices} x {per_device} x {accumulation} "
        "= {answer}. Accumulation adds samples per step without more memory; each step just "
        "takes longer.",
        integer=True, worked={"devices": 8, "per_device": 32, "accumulation": 4}),
    NumericQuestion(
        "lr-scaling-02", LR,
        "A recipe was tuned with learning rate {base_lr:g} at global batch {base_batch}. You "
        "now train at global batch {new_batch} and follow the linear scaling rule. What "
        "learning rate do you use after warmup?",
        grid={"base_lr": (0.0005, 0.001, 0.002), "base_batch": (128, 256),
              "new_batch": (512, 1024, 2048)},
        compute=lambda base_lr, base_batch, new_batch:
            scaled_lr(base_lr, base_batch, new_batch, rule="linear"),
        explanation="The linear rule multiplies the LR by the batch ratio: {base_lr:g} x "
        "({new_batch} / {base_batch}) = {base_lr:g} x {ratio} = {answer}. A {ratio}x larger batch "
        "averages away gradient noise, so each step can move further; warm up to this rate "
        "rather than starting at it.",
        derive=_ratios, worked={"base_lr": 0.001, "base_batch": 256, "new_batch": 1024}),
    NumericQuestion(
        "lr-scaling-03", LR,
        "The target learning rate is {target_lr:g}, reached by a linear warmup from 0 over "
        "the first {warmup_steps} optimizer steps (steps counted from 0). What is the "
        "learning rate at step {step}?",
        grid={"target_lr": (0.002, 0.004, 0.008), "warmup_steps": (500, 1000, 2000),
              "step": (100, 250, 400, 750)},
        compute=lambda target_lr, warmup_steps, step: warmup_lr(target_lr, step, warmup_steps),
        explanation="During a linear warmup the LR is the target times the share of warmup "
        "done: {target_lr:g} x {step} / {warmup_steps} = {answer}. Ramping up avoids full-size "
        "steps while the weights are random and the gradients largest, the usual cause of "
        "early loss spikes after scaling up.",
        valid=lambda target_lr, warmup_steps, step: step < warmup_steps,
        worked={"target_lr": 0.004, "warmup_steps": 500, "step": 250}),
    NumericQuestion(
        "lr-scaling-04", LR,
        "An Adam recipe used learning rate {base_lr:g} at global batch {base_batch}. You "
        "scale to global batch {new_batch} with the square-root rule. What is the new "
        "learning rate? (3 significant figures are enough.)",
        grid={"base_lr": (0.0001, 0.0003, 0.001), "base_batch": (256,),
              "new_batch": (512, 1024, 4096, 16384)},
        compute=lambda base_lr, base_batch, new_batch:
            scaled_lr(base_lr, base_batch, new_batch, rule="sqrt"),
        explanation="The square-root rule multiplies by sqrt({new_batch} / {base_batch}) = "
        "{factor}: {base_lr:g} x {factor} = {answer}. It raises the LR more gently than the "
        "linear rule (which would multiply by {ratio}), a common choice for adaptive "
        "optimizers such as Adam.",
        derive=_ratios),
    NumericQuestion(
        "lr-scaling-05", LR,
        "A schedule warms up linearly over {warmup_steps} steps to {target_lr:g}, then follows "
        "a cosine decay that reaches 0 at step {total_steps}. What is the learning rate at "
        "step {step}? (3 significant figures are enough.)",
        grid={"target_lr": (0.001, 0.004), "warmup_steps": (500, 1000),
              "decay_steps": (10000, 20000), "frac": (0.25, 0.5, 0.75)},
        compute=_cosine_lr,
        explanation="After warmup the cosine spans {decay_steps} steps, and step {step} is "
        "{frac:g} of the way through, so LR = {target_lr:g} x (1 + cos(pi x {frac:g})) / 2 = "
        "{answer}. The cosine stays near the peak early, falls fastest in the middle and "
        "flattens out near the end.",
        derive=_cosine_point),
    ChoiceQuestion(
        "lr-scaling-06", LR,
        "You move from 1 GPU to 8 GPUs at the same per-GPU batch and keep the learning rate "
        "unchanged. What typically happens?",
        "It trains, but learns less per sample and may end less accurate",
        ("The run stops with a shape-mismatch error when the per-GPU batches are concatenated",
         "Training diverges because the gradients are summed, so they are 8x larger",
         "Nothing changes: DDP detects the new world size and rescales the learning rate"),
        "DDP averages gradients, so their size does not grow, but an epoch now takes 8x fewer "
        "steps of the same length. The model makes less progress per sample and can end "
        "less accurate, and no error says why. Scale the LR with the global batch (linear "
        "rule) and warm up to it."),
    ChoiceQuestion(
        "lr-scaling-07", LR,
        "The loss diverges after you scale from 1 to 8 GPUs. Which change should you try first?",
        "Recheck the scaled LR, warm up longer and clip gradients (e.g. norm 1.0)",
        ("Remove the warmup so the target learning rate is reached sooner and held longer",
         "Double the learning rate to push the optimizer through the unstable region",
         "Turn off the gradient all-reduce for the first epoch so each rank settles alone"),
        "Divergence right after scaling is usually a learning-rate problem: a wrong global "
        "batch in the scaling formula, too short a warmup, or rare huge gradients. Check the "
        "arithmetic, warm up for a few hundred steps and clip the gradient norm; then check "
        "the mixed-precision loss scaling and BatchNorm synchronisation."),
]
