"""3D parallelism on paper: what each rank of a dp x pp x tp grid holds and sends.

Teaches how the three axes divide a model (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM"):

* **tensor parallelism** (t ranks) splits the big matrices of every block: Q, K, V and the
  first MLP linear by output columns, the attention output and second MLP linear by input
  rows, so a block's ``12 h^2 + 7 h`` split parameters become ``(12 h^2 + 7 h) / t`` per
  rank; LayerNorms and the two output biases (``6 h``) stay whole. It all-reduces one
  activation (b x s x h) twice forward and twice backward per block, per microbatch — the
  most frequent traffic, which is why a TP group belongs inside a node;
* **pipeline parallelism** (p ranks) gives each rank a contiguous run of blocks; the first
  stage also holds the embeddings, the last the final LayerNorm and head. Each stage
  boundary carries one activation forward and one gradient back per microbatch;
* **data parallelism** (d ranks, optionally ZeRO) replicates all that and averages
  gradients: per rank, a ring all-reduce of its own parameters, ``2 (d-1)/d x 4 N_r``
  bytes; ZeRO-1/2 send the same as a reduce-scatter plus an all-gather; ZeRO-3 gathers the
  parameters before every forward and every backward, once per MICROBATCH under a
  pipeline (``2 M`` gathers a step, which is why DeepSpeed refuses ZeRO-3 with pipelines).

Traffic is in *wire* bytes (what ranks send, nccl-tests' ring factors) per training step,
summed over every rank of the grid; point-to-point counts the bytes sent. Memory is model
state per rank (``labkit.theory.zero_memory`` of the parameters that rank holds).
The lab's MLP can be laid out on dp x pp (its layers have no Megatron column/row pairs):
its ``depth`` blocks are Linear+ReLU pairs, the first one taking the input (``in_dim``), and
its classifier rides with the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.base.errors import ConfigError
from labkit.theory.batch import check_choice, check_int
from labkit.theory.comm import BUSBW_FACTORS
from labkit.theory.memory import zero_memory

KINDS = ("gpt", "mlp")


def gpt_params(vocab: int, width: int, depth: int, seq_len: int) -> dict[str, int]:
    """Parameter counts of ``labkit.train.models.gpt``: ``embedding`` (token + position),
    one ``block`` (``12 h^2 + 13 h``), ``final`` (LayerNorm + head) and ``total``."""
    v = check_int("vocab", vocab, 1, "vocab=96")
    h = check_int("width", width, 1, "width=128")
    n = check_int("depth", depth, 1, "depth=4")
    s = check_int("seq_len", seq_len, 1, "seq_len=64")
    out = {"embedding": (v + s) * h, "block": 12 * h * h + 13 * h, "final": 2 * h + h * v}
    out["total"] = out["embedding"] + n * out["block"] + out["final"]
    return out


def _block_local(kind: str, width: int, tp: int) -> int:
    if kind == "mlp":
        return width * width + width
    return (12 * width * width + 7 * width) // tp + 6 * width


def _bounds(depth: int, pp: int, bounds: list[int] | None) -> list[int]:
    if bounds is not None:
        if len(bounds) != pp + 1 or bounds[0] != 0 or bounds[-1] != depth:
            raise ConfigError(f"bounds ({bounds}) must have pp + 1 = {pp + 1} entries from 0 "
                              f"to depth ({depth}); e.g. bounds={[0, depth]}")
        return list(bounds)
    if depth < pp:
        raise ConfigError(f"depth ({depth}) must be >= pp ({pp}): every stage needs a block; "
                          f"e.g. depth={pp * 2}")
    base, extra = divmod(depth, pp)
    out = [0]
    for k in range(pp):
        out.append(out[-1] + base + (1 if k < extra else 0))
    return out


@dataclass
class Layout3D:
    """What one rank of each pipeline stage holds, and what the whole grid sends per step."""

    dp: int
    pp: int
    tp: int
    bounds: list[int]
    """Stage k holds blocks bounds[k] .. bounds[k+1]-1."""
    params_per_rank: list[int]
    """By pipeline stage: the parameters ONE rank of that stage holds (its TP slice)."""
    memory_per_rank: list[dict[str, float]]
    """By pipeline stage: model-state bytes per rank (params, grads, optimizer, total)."""
    traffic: dict[str, float]
    """Wire bytes per step on each axis (dp, pp, tp), summed over all ranks."""
    activation_bytes: int
    """One microbatch's activation at a block boundary (bytes)."""
    calls: dict[str, int] = field(default_factory=dict)
    """Messages per step on each axis for the busiest rank (each pays a latency): tp
    all-reduces, pp sends + receives, dp one bucketed gradient exchange."""
    notes: list[str] = field(default_factory=list)
    cp: int = 1
    """Context-parallel ranks (the sequence split over them)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    def max_memory(self) -> float:
        """The fullest rank's model state (bytes): what must fit."""
        return max(m["total"] for m in self.memory_per_rank)

    def to_json(self) -> dict[str, Any]:
        return {"dp": self.dp, "pp": self.pp, "tp": self.tp, "cp": self.cp, "bounds": self.bounds,
                "params_per_rank": self.params_per_rank,
                "memory_per_rank": self.memory_per_rank, "traffic": self.traffic,
                "activation_bytes": self.activation_bytes}


def parallel_layout(*, kind: str = "gpt", width: int = 128, depth: int = 4, heads: int = 4,
                    seq_len: int = 64, vocab: int = 96, in_dim: int = 32, out_dim: int = 10,
                    dp: int = 1, pp: int = 1, tp: int = 1, microbatches: int = 1,
                    batch_size: int = 32, zero_stage: int = 0, optimizer: str = "adam",
                    bounds: list[int] | None = None,
                    sequence_parallel: bool = False, cp: int = 1, experts: int = 0,
                    ep: int = 1, top_k: int = 1) -> Layout3D:
    """Predict a dp x pp x tp run of labkit's GPT (or MLP): per-rank parameters and model
    state, and wire bytes per step on each axis (fp32; ``batch_size`` per data rank).

    ``sequence_parallel`` (Korthikanti et al. 2022): each block's 4 all-reduces of one
    activation B become 4 all-gather + reduce-scatter pairs, ``2 x (t-1)/t x B`` either way;
    entering and leaving the split add one all-gather each per microbatch (the embedding's
    gradient, the final LayerNorm's input); the 6 h-vectors of each block that now see a
    slice of the tokens (2 LayerNorms, 2 output biases) all-reduce their gradients once per
    microbatch, ``2 (t-1)/t x 24 h`` bytes; a pipeline cut carries B / t.

    ``cp`` (context parallelism, ring attention; ``labkit.theory.context``): every rank holds
    s / cp tokens, so every activation above is 1/cp as big and there are cp times as many
    ranks; each attention layer sends ``(cp-1)`` K/V blocks forward and ``(cp-1)`` K/V plus
    ``cp`` dK/dV blocks backward per microbatch (``ring_attention_traffic``, fp32), and the
    replicated weights' step gradients are averaged over the cp group (an all-reduce of the
    stage's parameters, ``2 (cp-1)/cp x 4 N_r``).

    ``experts`` > 0 (tp = 1): every MLP is an MoE layer (router ``h x E``, ``E`` MLPs) whose
    experts are split over ``ep`` data ranks (1 or dp). The experts are not in ZeRO's units:
    with ep = 1 their gradients are all-reduced over dp, with ep = dp not at all; each MoE
    forward sends ``labkit.theory.experts.expert_parallel_traffic``'s bytes on the ep axis,
    here with no token dropped (``tokens x top_k`` rows kept). Model-state memory is that of
    ZeRO on every parameter (the experts' own accounting is left out)."""
    check_choice("kind", kind, KINDS, "kind='gpt'")
    d, p, t = (check_int(n, v, 1, f"{n}=2") for n, v in (("dp", dp), ("pp", pp), ("tp", tp)))
    m = check_int("microbatches", microbatches, 1, "microbatches=4")
    b = check_int("batch_size", batch_size, 1, "batch_size=32")
    if kind == "gpt" and (heads % t or width % t):
        raise ConfigError(f"tp ({t}) must divide heads ({heads}) and width ({width}); "
                          f"e.g. tp=2 with heads=4, width=128")
    c = check_int("cp", cp, 1, "cp=2")
    if c > 1 and (kind != "gpt" or seq_len % (2 * c)):
        raise ConfigError(f"cp ({c}) needs kind='gpt' and seq_len ({seq_len}) a multiple of "
                          f"2 x cp; e.g. kind='gpt', seq_len=64, cp=2")
    if sequence_parallel and (kind != "gpt" or (seq_len // c) % t):
        raise ConfigError(f"sequence_parallel needs kind='gpt' and tp ({t}) dividing seq_len "
                          f"({seq_len}) / cp ({c}); e.g. kind='gpt', seq_len=64, tp=2")
    if kind == "mlp" and t != 1:
        raise ConfigError(f"tp ({t}) must be 1 for the MLP: its layers have no column/row "
                          f"pair to split; use kind='gpt'")
    if b % m:
        raise ConfigError(f"batch_size ({b}) must be a multiple of microbatches ({m}); "
                          f"e.g. batch_size={m * max(1, b // m)}")
    cuts = _bounds(depth, p, bounds)
    if kind == "gpt":
        full = gpt_params(vocab, width, depth, seq_len)
        first, last = full["embedding"], full["final"]
        act = (b // m) * seq_len * width * 4
    else:  # block 0 is the input layer (in_dim -> width); the classifier is the epilogue
        first, last = in_dim * width + width - _block_local(kind, width, t), \
            width * out_dim + out_dim
        act = (b // m) * width * 4
    block = _block_local(kind, width, t)
    per_expert = 8 * width * width + 5 * width  # one GELU MLP, 4x wide, with its biases
    if experts:  # the MLP gives way to the router and this rank's experts
        block += width * experts - per_expert
        if experts % ep or (d % ep) or t != 1 or kind != "gpt":
            raise ConfigError(f"experts ({experts}) need kind='gpt', tp=1 and ep ({ep}) "
                              f"dividing experts and dp ({d}); e.g. experts=4, ep=2, dp=2")
    local_experts = [(cuts[k + 1] - cuts[k]) * (experts // ep) * per_expert for k in range(p)]
    params = [(cuts[k + 1] - cuts[k]) * block + local_experts[k] + (first if k == 0 else 0)
              + (last if k == p - 1 else 0) for k in range(p)]
    memory = [zero_memory(n_r, d, zero_stage, "fp32", optimizer) for n_r in params]
    # wire bytes per payload byte in a ring (nccl-tests' factors, theory.comm)
    all_reduce, gather = BUSBW_FACTORS["all_reduce"], BUSBW_FACTORS["all_gather"]
    ranks = d * c * t  # ranks per pipeline stage
    gathers = 2 * m if zero_stage == 3 else (1 if zero_stage in (1, 2) else 0)
    dp_bytes = sum(ranks * 4 * (n_r - x) * (all_reduce(d) if zero_stage == 0  # a reduce-scatter
                                            else gather(d) * (1 + gathers))  # and all-gathers
                   + (ranks * 4 * x * all_reduce(d) if ep == 1 else 0.0)
                   for n_r, x in zip(params, local_experts))
    blocks = [cuts[k + 1] - cuts[k] for k in range(p)]
    act_c = act / c  # one microbatch's activation on one cp rank (what TP talks about)
    tp_bytes = (ranks * sum(blocks) * m * 4 * all_reduce(t) * act_c) if kind == "gpt" else 0.0
    sp = sequence_parallel and t > 1
    if sp:
        tp_bytes += ranks * m * gather(t) * (2 * act_c + sum(blocks) * 2 * 24 * width)
    pp_bytes = ranks * (p - 1) * m * 2 * act_c / (t if sp else 1)
    cp_bytes = 0.0
    if c > 1:
        from labkit.theory.context import ring_attention_traffic

        kv = ring_attention_traffic(b // m, seq_len, heads // t, width // heads, c, 4)
        per_layer = kv["forward"] + kv["backward"]
        cp_bytes = sum(ranks * (nb * m * per_layer + all_reduce(c) * 4 * n_r)
                       for nb, n_r in zip(blocks, params))
    ep_bytes = 0.0
    if experts and ep > 1:
        from labkit.theory.experts import expert_parallel_traffic

        kept = (b // m) * (seq_len // c) * top_k * m  # one rank, one layer, every microbatch
        ep_bytes = sum(ranks * expert_parallel_traffic([kept * nb], width, experts, m * nb)
                       for nb in blocks)
    calls = {"tp": m * (10 if sp else 4) * max(blocks) + (2 * m if sp else 0) if t > 1 else 0,
             "pp": 2 * m * (2 if p > 2 else 1) if p > 1 else 0, "dp": 1 if d > 1 else 0}
    notes = []
    if zero_stage == 3 and p > 1:
        notes.append(f"ZeRO-3 under a pipeline gathers every parameter 2 x {m} times a step "
                     f"(forward and backward of each microbatch)")
    return Layout3D(d, p, t, cuts, params, memory,
                    {"dp": dp_bytes, "pp": float(pp_bytes), "cp": float(cp_bytes),
                     "tp": float(tp_bytes), "ep": ep_bytes}, act, calls, notes, c)
