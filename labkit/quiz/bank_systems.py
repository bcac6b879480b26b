"""Quiz questions: 3D parallelism (lesson 09) and training across nodes (lesson 10).

3D: ranks on a ``dp x pp x tp`` grid with tp fastest (``labkit.base.grid``, after picotron's
process-group manager), so a tensor-parallel group is a run of neighbouring ranks that sits
in one node; memory per rank is ZeRO over dp of the tp x pp shard
(``theory.zero_memory``); MFU is model FLOPs (``theory.training_flops``, Kaplan et al. 2020)
over time x peak. Across nodes: the alpha-beta model with labkit's link presets
(``theory.get_link``: InfiniBand HDR 200 Gb/s = 25 GB/s, seed 001's table), the two-level
all-reduce (``theory.hierarchical_allreduce_bytes``) and why TP stays inside a node
(Megatron-LM; seed 003's "tensor-parallel within a node, pipeline-parallel across nodes").
"""

from __future__ import annotations

from labkit.base.grid import Grid
from labkit.quiz.questions import ChoiceQuestion, Concept, NumericQuestion, Question, format_number
from labkit.theory import (
    get_link,
    hierarchical_allreduce_bytes,
    ring_allreduce_time,
    training_flops,
    zero_memory,
)

D3, NET = Concept.THREE_D, Concept.MULTI_NODE
LINK_NAMES = {"infiniband_hdr": "InfiniBand HDR (200 Gb/s)", "ethernet_100g": "100 Gb Ethernet",
              "ethernet_10g": "10 Gb Ethernet"}


def _mfu(params_m: float, tokens_k: float, step_s: float, gpus: int, peak_tf: float) -> float:
    flops = training_flops(int(params_m * 1e6), int(tokens_k * 1000))
    return flops / (step_s * gpus * peak_tf * 1e12)


def _link_time(link: str, size_gb: float, nodes: int) -> float:
    ln = get_link(link)
    return ring_allreduce_time(size_gb * 1e9, nodes, ln.alpha_s, ln.bandwidth_Bps)


QUESTIONS: list[Question] = [
    # ------------------------------------------------------------ 3D parallelism
    NumericQuestion(
        "3d-01", D3,
        "labkit numbers ranks on a dp x pp x tp grid with tp fastest: rank = dp_rank x (pp x "
        "tp) + pp_rank x tp + tp_rank. With dp = {dp}, pp = {pp}, tp = {tp}, which global rank "
        "has dp_rank = {d}, pp_rank = {p}, tp_rank = {t}?",
        grid={"dp": (2, 4), "pp": (2, 4), "tp": (2, 4, 8), "d": (0, 1), "p": (0, 1),
              "t": (0, 1, 3)},
        compute=lambda dp, pp, tp, d, p, t: Grid(dp=dp, pp=pp, tp=tp).rank(d, p, t),
        valid=lambda dp, pp, tp, d, p, t: t < tp,
        explanation="{d} x ({pp} x {tp}) + {p} x {tp} + {t} = {answer}. The tp coordinate "
        "changes fastest, so the {tp} ranks of one tensor-parallel group are neighbours "
        "(started {tp} per node, a TP group never leaves its node).",
        integer=True),
    NumericQuestion(
        "3d-02", D3,
        "A {params_b}B-parameter model trains with mixed-precision Adam (16 B per parameter) "
        "on a tp = {tp} x pp = {pp} x dp = {dp} grid, with ZeRO-1 across the dp ranks. How "
        "many GB of model state does each GPU hold? (3 significant figures are enough.)",
        grid={"params_b": (13, 70, 175), "tp": (4, 8), "pp": (2, 4, 8), "dp": (4, 16)},
        compute=lambda params_b, tp, pp, dp:
            zero_memory(params_b * 1e9 / (tp * pp), dp, 1)["total"] / 1e9,
        explanation="Tensor and pipeline parallelism split the weights over tp x pp = {tpp} "
        "GPUs: {shard} B parameters each. That shard holds 2 + 2 B (weights, grads) per "
        "parameter, and ZeRO-1 splits its 12 B of optimizer state over the dp = {dp} "
        "replicas: {answer} GB.",
        unit="GB",
        derive=lambda params_b, tp, pp, dp: {"tpp": tp * pp,
                                             "shard": format_number(params_b / (tp * pp))}),
    NumericQuestion(
        "3d-03", D3,
        "One training step of a model with {params_m}M matmul parameters processes {tokens_k}k "
        "tokens in {step_s} s on {gpus} GPUs of {peak_tf} TFLOP/s peak each. What is the model "
        "FLOPs utilisation (MFU), as a fraction? (Count 6 FLOPs per parameter per token.)",
        grid={"params_m": (350, 1300), "tokens_k": (256, 512), "step_s": (1.5, 3.0),
              "gpus": (8, 16), "peak_tf": (312, 989)},
        compute=_mfu,
        explanation="Model FLOPs = 6 x N x tokens = {flops} per step (forward 2N, backward "
        "4N per token). Divided by step time x GPUs x peak: {answer}. MFU counts only the "
        "work the model needs, so recomputation and communication lower it.",
        derive=lambda params_m, tokens_k, **_: {"flops": f"{6 * params_m * 1e6 * tokens_k * 1e3:.3g}"}),
    NumericQuestion(
        "3d-04", D3,
        "A run uses dp = {dp}, pp = {pp}, tp = {tp}. How many separate tensor-parallel groups "
        "(sets of ranks that all-reduce activations together) are there?",
        grid={"dp": (2, 4, 8), "pp": (2, 4), "tp": (2, 4, 8)},
        compute=lambda dp, pp, tp: Grid(dp=dp, pp=pp, tp=tp).world_size // tp,
        explanation="Ranks that differ only in their tp coordinate form one group, so there "
        "is one TP group per (dp, pp) pair: {dp} x {pp} = {answer} groups of {tp}.",
        integer=True),
    ChoiceQuestion(
        "3d-05", D3,
        "Why does labkit's rank grid put the tensor-parallel axis fastest (tp_rank changes "
        "between neighbouring ranks)?",
        "So a TP group is consecutive ranks, placed in one node with fast links",
        ("So the pipeline stages get the lowest rank numbers and can therefore start "
         "their forward passes first",
         "Because data parallelism needs the slowest axis to overlap",
         "So rank 0 holds every tensor-parallel shard of the first layer"),
        "Launchers place consecutive ranks on the same node. Tensor parallelism all-reduces "
        "activations in every layer on the critical path, so its groups must stay on NVLink; "
        "making tp the fastest axis keeps each group within one node, while pipeline and data "
        "parallelism, which talk far less often, span the nodes."),
    ChoiceQuestion(
        "3d-06", D3,
        "In a 3D-parallel step, which axis usually moves the most bytes on the critical path?",
        "Tensor parallel: activations are all-reduced inside every layer",
        ("Data parallel: gradients cross all replicas once per step",
         "Pipeline parallel: activations travel between every pair of stages",
         "All three move the same bytes; only latency differs"),
        "TP all-reduces a layer's activations twice per layer forward and again backward, "
        "and nothing can run until they arrive. DP's gradient all-reduce is one per step and "
        "hides behind backward; PP sends one activation per microbatch to one neighbour."),
    ChoiceQuestion(
        "3d-07", D3,
        "In 3D parallelism, which ranks take part in one data-parallel gradient all-reduce?",
        "The replicas holding the same (pp, tp) shard, one in each dp slice",
        ("Every rank of the job, since the gradients of all weights must be global and identical everywhere",
         "The tp ranks of one layer, since they share its weights",
         "The pp stages of one replica, from last to first"),
        "Each (pp_rank, tp_rank) pair owns one shard of the weights; dp copies of that shard "
        "exist, one per data-parallel slice, and only they must agree. So the DP group has "
        "dp ranks and its all-reduce carries 1/(tp x pp) of the gradients."),
    # ------------------------------------------------------------ across nodes
    NumericQuestion(
        "net-01", NET,
        "{nodes} nodes are joined by {link_name} (labkit's preset: {bw_gb} GB/s per direction, "
        "{alpha_us} us per message). By the alpha-beta model, how many milliseconds does a "
        "ring all-reduce of {size_gb} GB across one GPU per node take? (3 significant figures.)",
        grid={"link": ("infiniband_hdr", "ethernet_100g", "ethernet_10g"), "nodes": (2, 4, 8),
              "size_gb": (0.5, 2.0)},
        compute=lambda link, nodes, size_gb: _link_time(link, size_gb, nodes) * 1e3,
        explanation="Each GPU sends 2(n-1)/n x {size_gb} GB in 2(n-1) messages: "
        "2(n-1) x alpha + bytes / bandwidth = {answer} ms. Across nodes the bandwidth term "
        "dominates, which is why the link (and the bytes you put on it) decide scaling.",
        unit="ms",
        derive=lambda link, **_: {"link_name": LINK_NAMES[link],
                                  "bw_gb": format_number(get_link(link).bandwidth_Bps / 1e9),
                                  "alpha_us": format_number(get_link(link).alpha_s * 1e6)}),
    NumericQuestion(
        "net-02", NET,
        "On {link_name} (alpha = {alpha_us} us, {bw_gb} GB/s), at what message size in kB do "
        "latency and transfer time become equal (alpha = size / bandwidth)?",
        grid={"link": ("infiniband_hdr", "ethernet_100g", "ethernet_10g")},
        compute=lambda link: get_link(link).alpha_s * get_link(link).bandwidth_Bps / 1e3,
        explanation="alpha x bandwidth = {answer} kB. Messages much smaller than this pay "
        "mostly latency, so fusing them (DDP's buckets) helps; much larger ones are "
        "bandwidth-bound, so only fewer bytes (bf16, compression) or a faster link help.",
        unit="kB",
        derive=lambda link: {"link_name": LINK_NAMES[link],
                             "bw_gb": format_number(get_link(link).bandwidth_Bps / 1e9),
                             "alpha_us": format_number(get_link(link).alpha_s * 1e6)}),
    NumericQuestion(
        "net-03", NET,
        "{nodes} nodes of {g} GPUs all-reduce a {size_gb} GB gradient hierarchically: "
        "reduce-scatter inside each node, ring across nodes on each GPU's 1/{g} shard, then "
        "all-gather inside. How many GB does each GPU send over the inter-node network?",
        grid={"nodes": (2, 4, 8), "g": (4, 8), "size_gb": (1.0, 4.0)},
        compute=lambda nodes, g, size_gb:
            hierarchical_allreduce_bytes(size_gb * 1e9, g, nodes)["inter"] / 1e9,
        explanation="After the node's reduce-scatter each GPU owns {size_gb} / {g} GB; the "
        "ring between the {nodes} nodes sends 2(n-1)/n of that: {answer} GB. Only 1/{g} of "
        "the gradient per GPU crosses the slow link; the rest moves on NVLink.",
        unit="GB"),
    ChoiceQuestion(
        "net-04", NET,
        "What does a hierarchical (two-level) all-reduce buy on a multi-node cluster?",
        "Each GPU sends only 1/g of the data over the slow inter-node link",
        ("It removes the need for any all-gather at the end, because every node already holds the full sum",
         "It lets every GPU skip the reduce-scatter inside its node",
         "It halves the bytes every GPU sends in total"),
        "Inside the node the GPUs first reduce-scatter over NVLink, so each holds the node's "
        "sum of a 1/g shard; only those shards cross nodes, one ring per local rank, in "
        "parallel; an all-gather inside the node finishes. The inter-node bytes per GPU drop g "
        "times; total bytes per GPU stay about twice the gradient."),
    ChoiceQuestion(
        "net-05", NET,
        "A job spans 4 nodes of 8 GPUs. Where should its tensor-parallel groups go?",
        "Inside one node, e.g. tp = 8 on NVLink, with pipeline or data parallelism across",
        ("Across nodes, tp = 4 with one GPU per node, to spread the memory",
         "Wherever the cluster scheduler happens to put them: NCCL always finds and "
         "picks the fastest route anyway",
         "Across nodes, because InfiniBand has lower latency than NVLink"),
        "TP's all-reduces sit inside every layer's forward and backward. Over NVLink (hundreds "
        "of GB/s) they are cheap; over InfiniBand HDR (25 GB/s) the same bytes take an order of "
        "magnitude longer, on the critical path. Seed 003's rule: tensor-parallel within a node, "
        "pipeline-parallel across nodes."),
    ChoiceQuestion(
        "net-06", NET,
        "A gradient all-reduce across 8 nodes is 60% of each step. Which change helps MOST?",
        "Send fewer bytes: bf16 gradients, compression, or accumulate before each all-reduce",
        ("Add a ninth node so each ring chunk is smaller",
         "Lower the per-message latency by using many smaller buckets, so that each "
         "message spends less time on the wire",
         "Move the optimizer step before the backward pass"),
        "Large gradient all-reduces are bandwidth-bound: time is about 2 x bytes / bandwidth "
        "whatever the node count, so more nodes do not shrink it and smaller buckets add "
        "latency. Halving the bytes (bf16) halves it; accumulation sends it once per k "
        "micro-batches; overlap hides what is left."),
]
