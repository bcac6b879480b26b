"""The planner's terms: memory per GPU and communication time, each with its formula and source.

Teaches where a layout's bytes and seconds come from, one named term at a time:

* **Model states** per GPU: ``labkit.theory.zero_memory`` of the parameters one GPU holds
  (its pipeline stage's layers, split by tensor parallelism), gradients at their kept width
  (fp32 where the run accumulates in fp32).
* **Activations** per layer: Korthikanti et al. 2022 (``labkit.theory.activations``) for the
  GPT shape they tabulate; for other decoders (GQA, SwiGLU, flash attention) the same count
  term by term (``decoder_layer_bytes``), which equals theirs on their shape. In flight:
  1F1B keeps ``min(p, m)`` microbatches of a stage (``pipeline_peak_activations``), i.e. L
  layers' worth on stage 0 (their section 4.2.3); Megatron's interleaved schedule warms up
  ``2(p-1) + (v-1)p`` chunks (``get_num_warmup_microbatches``), ``L (1 + (p-1)/(p v))``.
* **Collectives** over a group placed on the grid ``[tp, pp, dp]`` (tp fastest: Llama 3's
  ``[TP, CP, PP, DP]``, labkit's ``Grid``): inside one node a ring
  (``ring_allreduce_time``); across nodes the two-level all-reduce
  (``hierarchical_allreduce_bytes``): only ``1/k`` of the tensor crosses the network per GPU.

Constants (one set for every case; see docs/developing.md, "The planner"):

* ``LINK_EFFICIENCY`` = 0.8: the share of a link's datasheet bandwidth a large NCCL
  collective reaches (nccl-tests' bus bandwidth on DGX A100 is about 230-240 GB/s of NVLink
  3's 300 per direction; on InfiniBand 20-23 of HDR's 25 GB/s).
* ``RESERVE_BYTES`` = 2 GB: what the CUDA context, cuBLAS and NCCL workspaces and the
  caching allocator's fragmentation take from every GPU before the model does.

Units: bytes and seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.theory.activations import layer_activation_bytes
from labkit.theory.comm import ring_allreduce_time
from labkit.theory.interconnect import Interconnect
from labkit.theory.memory import bytes_per_param, zero_memory
from labkit.theory.pipeline import pipeline_peak_activations
from labkit.theory.plan_models import Cluster, Decoder, Training

LINK_EFFICIENCY = 0.8
RESERVE_BYTES = 2e9


@dataclass(frozen=True)
class Term:
    """One named quantity of a prediction: its value, the formula and where it comes from."""

    name: str
    value: float
    """Bytes for memory terms, seconds for time terms."""
    formula: str
    source: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "value": self.value, "formula": self.formula,
                "source": self.source}


@dataclass(frozen=True)
class Layout:
    """One way to lay a run out: dp x pp x tp, the schedule, ZeRO, microbatching."""

    dp: int
    tp: int
    pp: int
    micro_batch: int
    """Sequences per microbatch (b)."""
    microbatches: int
    """Microbatches per step per data-parallel replica (m; gradient accumulation when pp=1)."""
    schedule: str = "1f1b"
    """"1f1b" or "interleaved" (Narayanan et al. 2021)."""
    virtual: int = 1
    """Model chunks per pipeline rank (v, interleaved only)."""
    zero: int = 0
    """ZeRO stage (3 = FSDP: parameters sharded too)."""
    recompute: str = "none"

    def label(self) -> str:
        sched = f"{self.schedule}" + (f" v{self.virtual}" if self.virtual > 1 else "")
        pipe = f", {sched}" if self.pp > 1 else ""
        return (f"DP {self.dp} x TP {self.tp} x PP {self.pp}{pipe}, ZeRO-{self.zero}, "
                f"mb {self.micro_batch} x {self.microbatches}, recompute {self.recompute}")


# --- memory ---------------------------------------------------------------------------------

def stage_layers(model: Decoder, pp: int) -> int:
    """Layers on the fullest pipeline stage: ``ceil(L / p)``."""
    return math.ceil(model.layers / pp)


def decoder_layer_bytes(model: Decoder, training: Training, micro_batch: int, tp: int,
                        recompute: str) -> float:
    """Bytes one layer keeps for backward on one GPU, sequence parallelism on when tp > 1.

    Korthikanti et al.'s count per s*b*h, generalised (F = ffn/h, r = kv_heads/heads, 2-byte
    values, 1-byte dropout masks): norms' inputs 4; attention: QKV input 2, Q 2, K and V 4r,
    output-projection input 2 (+1 mask); FFN: input 2, gated 6F (gate, up, their product)
    or 4F (first output, activation), (+1 mask); the scores ``5 a s/h`` (``2 a s/h``
    without dropout) unless flash attention. With GPT's shape, dropout and no flash this is
    their ``34 + 5 a s/h``, and ``layer_activation_bytes`` itself is used. "selective"
    drops the scores and recomputes the norms and the FFN activation (Megatron-core's
    ``--recompute-modules core_attn layernorm`` and activation: elementwise work, no
    matmul); "full" keeps the layer input, 2 s b h."""
    s, b, h = model.seq, micro_batch, model.hidden
    if model.gpt_shaped and not training.flash_attention and training.dropout:
        return layer_activation_bytes(s, b, h, model.heads, tp=tp, sequence_parallel=tp > 1,
                                      recompute=recompute)
    sbh = float(s * b * h)
    if recompute == "full":
        return 2 * sbh
    f = model.ffn / h
    mask = 1.0 if training.dropout else 0.0
    attention = 2 + 2 + 4 * model.kv_ratio + 2 + mask
    ffn = 2 + (6 * f if model.swiglu else 4 * f) + mask
    norms = 4.0
    if recompute == "selective":
        norms, attention = 4.0, attention - 2  # norm outputs (QKV / FFN inputs) recomputed
        ffn = ffn - 2 - (2 * f)  # the activation (or gated product) recomputed
    scores = 0.0
    if not training.flash_attention and recompute == "none":
        scores = (5.0 if training.dropout else 2.0) * model.heads * s / h
    return sbh * (norms + attention + ffn + scores) / tp


def activation_terms(model: Decoder, training: Training, layout: Layout) -> list[Term]:
    """Activation bytes on the fullest GPU: layers in flight on stage 0, and the logits on
    the last stage (bf16 logits plus their fp32 copy for the loss, split by tp)."""
    p, m, v = layout.pp, layout.microbatches, layout.virtual
    per_layer = decoder_layer_bytes(model, training, layout.micro_batch, layout.tp,
                                    layout.recompute)
    layers = stage_layers(model, p)
    if p == 1:
        in_flight, how = float(layers), "one microbatch of all L layers"
    elif layout.schedule == "interleaved" and m >= p:
        in_flight = layers * p * (1 + (p - 1) / (p * v))
        how = f"L (1 + (p-1)/(p v)) = {in_flight:.1f} layers (interleaved warm-up)"
    else:
        peak = pipeline_peak_activations(p, min(m, p), "1f1b", 0)
        in_flight = float(layers * peak)
        how = f"{layers} layers x min(p, m) = {peak} microbatches (1F1B stage 0)"
    kept = per_layer * in_flight
    if layout.recompute == "full":  # the layer being recomputed is alive on top
        kept += decoder_layer_bytes(model, training, layout.micro_batch, layout.tp, "none")
    source = ("Korthikanti et al. 2022, Table 2 / section 4.2.3"
              if model.gpt_shaped and not training.flash_attention
              else "Korthikanti et al. 2022's count, generalised (decoder_layer_bytes)")
    logits = layout.micro_batch * model.seq * model.vocab * (training.value_bytes + 4) / layout.tp
    return [Term("activations", kept, f"{per_layer / 1e6:.1f} MB/layer x {how}", source),
             Term("logits", logits, "b s V (value + 4 fp32 bytes) / tp",
                  "the loss' fp32 upcast of the logits (last stage)")]


def params_on_gpu(model: Decoder, layout: Layout) -> float:
    """Parameters the fullest GPU holds: a stage's layers plus the embedding (stage 0; the
    head too when pp = 1), all split by tp."""
    layers = stage_layers(model, layout.pp) * model.layer_params
    ends = model.embedding_params + (model.head_params if layout.pp == 1 else 0.0)
    return (layers + max(ends, model.head_params)) / layout.tp


def memory_terms(model: Decoder, training: Training, layout: Layout) -> list[Term]:
    """Every memory term of the fullest GPU, in bytes: params, grads, optimizer (ZeRO),
    activations, logits, buffers, reserve."""
    n = params_on_gpu(model, layout)
    states = zero_memory(n, layout.dp, layout.zero, training.precision, training.optimizer)
    grads = states["grads"] * training.grad_bytes / bytes_per_param(training.precision)["grads"]
    zero = f"ZeRO-{layout.zero} over dp={layout.dp}"
    terms = [Term("params", states["params"], f"{n:.3g} params x {training.value_bytes} B"
                  + (" / dp" if layout.zero >= 3 else ""), f"zero_memory ({zero})"),
             Term("grads", grads, f"{n:.3g} x {training.grad_bytes} B"
                  + (" / dp" if layout.zero >= 2 else ""), f"zero_memory ({zero})"),
             Term("optimizer", states["optimizer"], f"{n:.3g} x optimizer bytes"
                  + (" / dp" if layout.zero >= 1 else ""),
                  "zero_memory (Rajbhandari et al. 2020)")]
    terms += activation_terms(model, training, layout)
    message = layout.micro_batch * model.seq * model.hidden * training.value_bytes / layout.tp
    buffers = 2 * message if layout.pp > 1 else 0.0
    what = "2 p2p activations" if layout.pp > 1 else ""
    if layout.zero == 3:  # the gathered layer and the prefetched next one
        buffers += 2 * model.layer_params / layout.tp * training.value_bytes
        what = "2 gathered layers (FSDP prefetch)"
    terms.append(Term("buffers", buffers, what or "none", "communication buffers"))
    terms.append(Term("reserve", RESERVE_BYTES, "CUDA context, workspaces, fragmentation",
                      "plan_terms.RESERVE_BYTES"))
    return terms


# --- communication --------------------------------------------------------------------------

def members_per_node(size: int, stride: int, per_node: int) -> int:
    """How many of a group's ``size`` members share a node, the group's ranks ``stride``
    apart on a grid filled node by node."""
    if stride >= per_node:
        return 1
    return max(1, min(size, per_node // stride))


def allreduce_time(size_bytes: float, members: int, stride: int,
                   net: Cluster) -> tuple[float, float]:
    """Seconds of an all-reduce of ``size_bytes`` over a group, and the share of it spent on
    the network between nodes. One node: a ring on the intra-node link. Several: the
    two-level all-reduce, each GPU's ``1/k`` shard ringed between nodes on its own NIC."""
    if members <= 1 or size_bytes <= 0:
        return 0.0, 0.0
    k = members_per_node(members, stride, net.per_node)
    nodes = members // k
    intra, inter = _usable(net.intra), _usable(net.inter)
    if nodes == 1:
        return ring_allreduce_time(size_bytes, k, intra.alpha_s, intra.bandwidth_Bps), 0.0
    # the intra-node reduce-scatter + all-gather is a ring's traffic and messages inside the
    # node; between nodes, a ring over each GPU's 1/k shard (hierarchical_allreduce_bytes)
    t_intra = ring_allreduce_time(size_bytes, k, intra.alpha_s, intra.bandwidth_Bps)
    t_inter = ring_allreduce_time(size_bytes / k, nodes, inter.alpha_s, inter.bandwidth_Bps)
    return t_intra + t_inter, t_inter / (t_intra + t_inter)


def _usable(link: Interconnect) -> Interconnect:
    return Interconnect(link.name, link.alpha_s, link.bandwidth_Bps * LINK_EFFICIENCY,
                        link.scope, link.note)


def p2p_time(size_bytes: float, crosses_nodes: bool, net: Cluster) -> float:
    """One point-to-point message between neighbouring stages: ``alpha + bytes / bandwidth``."""
    link = _usable(net.inter if crosses_nodes else net.intra)
    return link.alpha_s + size_bytes / link.bandwidth_Bps
