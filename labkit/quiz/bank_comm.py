"""Quiz questions: collectives, interconnects and overlap, Amdahl's law and scaling.

Follows the ring all-reduce cost model (Thakur, Rabenseifner and Gropp 2005; each rank
sends 2(n-1)/n of the buffer), nccl-tests' bus bandwidth (``doc/PERFORMANCE.md``), the
seed pages' interconnect figures (NVLink hundreds of GB/s, InfiniBand HDR 200 Gb/s =
25 GB/s) and the book chapter's "8 GPUs give 6x". Numeric keys come from
``labkit.theory.comm``.
"""

from __future__ import annotations

from typing import Any

from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question, format_number
from labkit.theory import (
    amdahl_speedup,
    busbw,
    dp_speedup,
    ring_allreduce_bytes,
    ring_allreduce_steps,
    ring_allreduce_time,
)

COLL, COMM, SCALE = Concept.COLLECTIVES, Concept.COMMUNICATION, Concept.SCALING


def _ring_time_parts(size_gb: float, world_size: int, bw_gb: float,
                     alpha_us: float) -> dict[str, Any]:
    sent = ring_allreduce_bytes(size_gb * 1e9, world_size)
    steps = ring_allreduce_steps(world_size)
    return {"steps": steps, "sent_gb": format_number(sent / 1e9),
            "latency_ms": format_number(steps * alpha_us * 1e-3),
            "transfer_ms": format_number(sent / (bw_gb * 1e9) * 1e3)}


def _dp_parts(compute_s: float, comm_s: float, n: int, overlap: float) -> dict[str, Any]:
    return {"overlap_pct": format_number(overlap * 100),
            "exposed": format_number((1 - overlap) * comm_s)}


def _amdahl_parts(parallel_fraction: float, n: int) -> dict[str, Any]:
    return {"pct": format_number(parallel_fraction * 100),
            "serial": format_number(round(1 - parallel_fraction, 6)),
            "speedup": format_number(amdahl_speedup(parallel_fraction, n)),
            "ceiling": format_number(1 / (1 - parallel_fraction))}


_AMDAHL_GRID = {"parallel_fraction": (0.9, 0.95, 0.99), "n": (4, 8, 16, 64)}

QUESTIONS: list[Question] = [
    # ------------------------------------------------------------ collectives
    NumericQuestion(
        "allreduce-01", COLL,
        "{world_size} ranks all-reduce a {size_gb:g} GB gradient buffer with the ring "
        "algorithm. How many GB does each rank send? (3 significant figures are enough.)",
        grid={"size_gb": (0.5, 1.0, 2.0, 4.0), "world_size": (2, 4, 8, 16)},
        compute=lambda size_gb, world_size: ring_allreduce_bytes(size_gb * 1e9, world_size) / 1e9,
        explanation="A ring all-reduce is a reduce-scatter then an all-gather, each n - 1 steps "
        "of a 1/n chunk: 2(n - 1)/n x {size_gb:g} GB = {answer} GB. As n grows this approaches "
        "twice the buffer, so per-rank traffic hardly depends on the number of ranks.",
        unit="GB"),
    NumericQuestion(
        "allreduce-02", COLL,
        "An nccl-tests all_reduce run on {world_size} GPUs reports an algorithm bandwidth "
        "(buffer size / time) of {algbw_gb:g} GB/s. What bus bandwidth, in GB/s, does it "
        "report? (3 significant figures are enough.)",
        grid={"algbw_gb": (40, 100, 150), "world_size": (2, 4, 8, 16)},
        compute=lambda algbw_gb, world_size: busbw(algbw_gb * 1e9, world_size, "all_reduce") / 1e9,
        explanation="For all-reduce, busbw = algbw x 2(n - 1)/n = {algbw_gb:g} x 2 x "
        "({world_size} - 1) / {world_size} = {answer} GB/s. The factor converts to what each "
        "link actually carried, so the number can be compared with the hardware's peak "
        "whatever the GPU count.",
        unit="GB/s"),
    ChoiceQuestion(
        "allreduce-03", COLL,
        "An all-reduce can be built from which two collectives, run one after the other?",
        "A reduce-scatter, then an all-gather",
        ("A broadcast, then a gather",
         "An all-gather, then a scatter",
         "A reduce to rank 0, then a barrier"),
        "After a reduce-scatter each rank owns 1/n of the summed buffer; an all-gather then "
        "gives every rank every piece. The ring algorithm does exactly this, and ZeRO uses the "
        "two halves separately: reduce-scatter for gradient shards, all-gather to rebuild "
        "parameters."),
    ChoiceQuestion(
        "allreduce-04", COLL,
        "With a ring all-reduce of the same gradient buffer, how does each rank's traffic "
        "change when you go from 8 to 64 GPUs?",
        "Barely: from 1.75x to about 1.97x the buffer size",
        ("It grows 8x",
         "It shrinks 8x, because each chunk is 8x smaller",
         "It doubles"),
        "Each rank sends 2(n - 1)/n times the buffer: 1.75x for n = 8, 1.97x for n = 64. "
        "Chunks get smaller but there are more steps. What does grow is latency, 2(n - 1) "
        "sequential messages, which is why small all-reduces on many GPUs get slow."),
    ChoiceQuestion(
        "allreduce-05", COLL,
        "Which collective does ZeRO-3 / FSDP use to rebuild a layer's full weights just "
        "before computing with them?",
        "all-gather",
        ("reduce-scatter", "broadcast from rank 0", "all-reduce"),
        "Each rank holds a 1/n shard of every parameter; an all-gather collects the shards so "
        "every rank briefly has the whole layer, and the copy is freed after use. Gradients go "
        "the other way with a reduce-scatter, so each rank keeps only the summed shard it "
        "owns."),
    # ------------------------------------------------------------ interconnect and overlap
    NumericQuestion(
        "comm-01", COMM,
        "{world_size} GPUs run a ring all-reduce of a {size_gb:g} GB buffer over links of "
        "{bw_gb:g} GB/s per direction, with {alpha_us:g} microseconds of latency per message. "
        "How long does it take, in milliseconds, by the alpha-beta model? (3 significant "
        "figures are enough.)",
        grid={"size_gb": (0.5, 1.0, 2.0), "world_size": (4, 8, 16),
              "bw_gb": (25, 100, 300), "alpha_us": (5, 10)},
        compute=lambda size_gb, world_size, bw_gb, alpha_us:
            ring_allreduce_time(size_gb * 1e9, world_size, alpha_us * 1e-6, bw_gb * 1e9) * 1e3,
        explanation="The ring takes 2(n - 1) = {steps} steps: latency {steps} x {alpha_us:g} us "
        "= {latency_ms} ms; each rank sends {sent_gb} GB, taking {transfer_ms} ms at {bw_gb:g} "
        "GB/s. Total {answer} ms. For big buffers bandwidth dominates, so a faster link (or "
        "fewer bytes) is what helps.",
        unit="ms", derive=_ring_time_parts),
    NumericQuestion(
        "comm-02", COMM,
        "Data parallel on {n} GPUs, same per-GPU batch as on 1 GPU. Each step computes for "
        "{compute_s:g} s; the gradient all-reduce takes {comm_s:g} s, and {overlap_pct}% of it "
        "hides behind the backward pass. What throughput speedup over 1 GPU do you expect? "
        "(3 significant figures are enough.)",
        grid={"compute_s": (0.2, 0.3, 0.5), "comm_s": (0.05, 0.1, 0.2), "n": (4, 8, 16),
              "overlap": (0.0, 0.5, 0.8)},
        compute=lambda compute_s, comm_s, n, overlap: dp_speedup(compute_s, comm_s, n, overlap),
        explanation="Only the unhidden part of the all-reduce adds to a step: (1 - {overlap:g}) x "
        "{comm_s:g} = {exposed} s. Each of {n} GPUs does one GPU's work per step, so the "
        "speedup is {n} x {compute_s:g} / ({compute_s:g} + {exposed}) = {answer}x. labkit's own "
        "example, 0.3 s compute and 0.1 s all-reduce with no overlap, gives seed 003's 6x "
        "on 8 GPUs.",
        unit="x", derive=_dp_parts,
        worked={"compute_s": 0.3, "comm_s": 0.1, "n": 8, "overlap": 0.0}),
    ChoiceQuestion(
        "comm-03", COMM,
        "How does DDP hide gradient communication behind the backward pass?",
        "It all-reduces gradients in buckets, each as soon as it is ready, during backward",
        ("It waits for backward to finish, then sends one large all-reduce of every gradient",
         "It sends the gradients during the next forward pass and applies them a step late",
         "It skips the all-reduce on steps where the gradient norm is small enough"),
        "Backward produces gradients from the last layer to the first. As soon as a bucket "
        "(about 25 MB by default) is complete, DDP launches its all-reduce while the earlier "
        "layers are still computing. Only the last bucket's communication is left exposed "
        "when backward ends."),
    ChoiceQuestion(
        "comm-04", COMM,
        "InfiniBand HDR is rated at 200 Gb/s. About how many gigabytes per second is that?",
        "25 GB/s",
        ("200 GB/s", "2.5 GB/s", "1.6 GB/s"),
        "Network links are quoted in bits: 200 Gb/s / 8 = 25 GB/s. Inside a node NVLink "
        "gives hundreds of GB/s per GPU, PCIe 4.0 x16 about 32 GB/s and plain Ethernet often "
        "1 to 3 GB/s. That gap is why all-reduce is cheap within a node and visible across "
        "nodes."),
    ChoiceQuestion(
        "comm-05", COMM,
        "What do gradient-compression methods such as top-k sparsification and PowerSGD do?",
        "Send a cheaper approximation of the gradient, trading fidelity for bandwidth",
        ("Compress the model weights stored on disk so checkpoints load faster",
         "Reduce the compute time of the backward pass by skipping small layers",
         "Make the all-reduce exact on slow links by adding error-correcting codes"),
        "Top-k sends only the largest gradient entries; PowerSGD sends a low-rank "
        "factorisation; both usually keep an error-feedback buffer so the dropped part is sent "
        "later. They pay off when the network is the bottleneck; with fast links, overlap "
        "plus bf16 gradients is usually enough."),
    ChoiceQuestion(
        "comm-06", COMM,
        "DDP's gradient communication usually costs a few percent of step time inside one "
        "8-GPU server but a lot more once the job spans servers. Why?",
        "Across servers gradients cross a network far slower than NVLink",
        ("More servers mean each GPU has more gradient bytes to send per step",
         "The ring all-reduce only works inside one server, so a slower algorithm runs",
         "GPUs in different servers cannot overlap communication with compute"),
        "Per-rank traffic in a ring barely changes with GPU count, but the slowest link in the "
        "ring sets its speed. Within a server that is NVLink at hundreds of GB/s; across "
        "servers it is the network, around 25 GB/s for InfiniBand HDR and less for Ethernet."),
    # ------------------------------------------------------------ Amdahl and scaling
    NumericQuestion(
        "amdahl-01", SCALE,
        "{pct}% of a training step's time parallelises perfectly; the rest is serial. What "
        "speedup does Amdahl's law predict on {n} GPUs? (3 significant figures are enough.)",
        grid=_AMDAHL_GRID,
        compute=lambda parallel_fraction, n: amdahl_speedup(parallel_fraction, n),
        explanation="Speedup = 1 / ((1 - p) + p / n) = 1 / ({serial} + {parallel_fraction:g} / "
        "{n}) = {answer}x. However many GPUs you add, it can never pass 1 / (1 - p) = "
        "{ceiling}x: the serial part does not shrink.",
        unit="x", derive=_amdahl_parts),
    NumericQuestion(
        "amdahl-02", SCALE,
        "{pct}% of a training step's time parallelises perfectly; the rest is serial. What "
        "parallel efficiency (speedup / number of GPUs) does Amdahl's law predict on {n} GPUs? "
        "Answer as a fraction (3 significant figures are enough).",
        grid=_AMDAHL_GRID,
        compute=lambda parallel_fraction, n: amdahl_speedup(parallel_fraction, n) / n,
        explanation="The speedup is 1 / ({serial} + {parallel_fraction:g} / {n}) = {speedup}x, so "
        "efficiency = {speedup} / {n} = {answer}. Efficiency falls as GPUs are added: each new "
        "GPU speeds up only the parallel part.",
        derive=_amdahl_parts),
    ChoiceQuestion(
        "amdahl-03", SCALE,
        "95% of a job parallelises perfectly. What is the largest speedup any number of GPUs "
        "can give?",
        "20x",
        ("95x", "Unlimited, with enough GPUs", "1.95x"),
        "As n grows, p / n goes to 0 and the speedup approaches 1 / (1 - p) = 1 / 0.05 = 20. "
        "Data loading, logging, optimizer work that is not sharded, and exposed communication "
        "all count as the serial part."),
    ChoiceQuestion(
        "amdahl-04", SCALE,
        "A DDP job gives 6x, not 8x, on 8 GPUs. What most likely caps it, and what narrows "
        "the gap?",
        "Exposed all-reduce time; overlap it with backward and send bf16 gradients",
        ("The learning rate is too low for the bigger batch; scale it linearly",
         "Python's GIL serialises the ranks; run them as threads instead",
         "Too many micro-batches per step; use fewer, larger ones instead"),
        "8 GPUs doing 8 GPUs' worth of compute lose the rest to waiting. In labkit's own "
        "example (no seed gives these numbers) each step computes for 0.3 s and then waits "
        "0.1 s for the all-reduce: throughput is 8 x 0.3 / 0.4 = 6x, seed 003's figure. "
        "Start the all-reduce during backward and send half the bytes; the learning rate "
        "affects accuracy, not throughput."),
    ChoiceQuestion(
        "amdahl-05", SCALE,
        "A job must run twice as fast as on one GPU, and you have 4 GPUs in one server. Which "
        "plan most likely reaches about 2x while staying stable?",
        "DDP on all 4 with bf16, scaled LR plus warmup, and overlap",
        ("A 4-stage pipeline with a single micro-batch per batch, in bf16",
         "Asynchronous SGD on 4 workers, keeping the original learning rate",
         "Tensor parallelism across the 4 GPUs in fp32 to keep full accuracy"),
        "The model fits, so data parallelism is the simple choice: over NVLink or PCIe in one "
        "server, overlapped bf16 all-reduces cost little and 4 GPUs leave plenty of margin "
        "for 2x. Scaling the LR with a warmup keeps the larger batch stable. A pipeline "
        "without micro-batches uses one GPU at a time, and tensor parallelism has no reason "
        "to be used for a model that fits."),
]
