"""A planner for training at scale: predict memory, step time and MFU of every layout, rank them.

Teaches how the lab's formulas compose into the question an applied scientist is asked
(seed 000: "choose a parallelism strategy and estimate speedup and costs"): for a model, a
cluster and a global batch, enumerate dp x tp x pp (schedule, virtual stages), ZeRO stage,
microbatch size and recomputation; predict each term with its formula and source
(``Prediction.memory`` and ``Prediction.time``); rank what fits by tokens/s; and say what
binds every layout that loses.

The step (one optimizer step of one data-parallel replica, on its slowest pipeline rank):

1. **compute** per microbatch per rank: the rank's layers' FLOPs (``6 N + 12 L s h`` per
   token, ``labkit.theory.training_flops``; Narayanan et al. 2021 eq. 3 counts the same)
   divided by tp, plus the logits on the last stage, plus recomputation (full: one more
   forward, 8 N instead of 6 N; selective without flash attention: the scores' forward),
   at the achievable rate ``peak x MAMF x COMPUTE_EFFICIENCY``; plus, where the device
   has one (a CPU's measured ``layer_s`` and ``step_s``, ``plan_local``; 0 on a GPU preset),
   a fixed cost per layer per microbatch and per step that no FLOP rate sees;
2. **tensor parallelism**: 2 all-reduce-sized collectives per layer forward, 2 backward, 2
   more with full recomputation (Megatron's f / g, as all-gather + reduce-scatter with
   sequence parallelism: the same bytes), ``b s h`` values each, on the critical path;
3. **pipeline**: the bubble of the schedule, ``bubble_fraction(p, m, schedule, v,
   "ideal")`` of the slots' time; p2p sends of ``b s h / t`` values (scatter/gather) hidden
   behind the slot's compute except the ``p - 1`` hops of fill and drain;
4. **data parallelism / ZeRO**: gradients reduced once a step (all-reduce; ZeRO-1/2:
   reduce-scatter plus the parameters' all-gather), hidden behind the last microbatch's
   backward (and the gather behind the next forward); ZeRO-3 (FSDP) gathers parameters
   twice and reduce-scatters gradients every microbatch, hidden behind its compute.
5. **shared cores** (a cluster with ``cores`` fewer than its ranks: "this machine"): ranks
   that share a core run one after another, so a step lasts at least every rank's compute
   added up over the cores; the ``cores`` term is what that adds to the step above.

Constant: ``COMPUTE_EFFICIENCY`` = 0.7, the share of a training step's compute that runs at
the GPU's maximum achievable matmul rate (MAMF; ``plan_models``): the rest is memory-bound
work (norms, activations, softmax / attention kernels below GEMM efficiency, the optimizer
step, launch gaps). Korthikanti et al. 2022 (Table 5) reach 57 % hardware FLOPs utilisation
end to end on a 1T GPT on A100s, bubble and communication included: 66 % of the A100's MAMF,
so the compute alone runs at about 0.7 of it. The same constant serves every case.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from labkit.base.errors import ConfigError
from labkit.theory.activations import RECOMPUTE
from labkit.theory.compute import training_flops
from labkit.theory.pipeline import bubble_fraction
from labkit.theory.plan_models import Cluster, Decoder, Training
from labkit.theory.plan_terms import (
    Layout,
    Term,
    allreduce_time,
    memory_terms,
    p2p_time,
    params_on_gpu,
    stage_layers,
)

COMPUTE_EFFICIENCY = 0.7
MICRO_BATCHES = (1, 2, 4, 8, 16)
VIRTUAL = (2, 4, 8)


@dataclass
class Prediction:
    """What one layout costs: memory and time, term by term, and what it yields."""

    layout: Layout
    memory: list[Term]
    time: list[Term]
    capacity_bytes: float
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    """Model FLOPs (no recomputation) per second / (GPUs x peak)."""
    hfu: float
    """Hardware FLOPs (recomputation included, as Narayanan et al. count) / (GPUs x peak)."""
    inter_share: dict[str, float] = field(default_factory=dict)
    """Per group (tp, dp, pp): the share of its communication time spent between nodes."""
    binding: str = ""

    @property
    def memory_bytes(self) -> float:
        return sum(t.value for t in self.memory)

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes

    def to_json(self) -> dict[str, object]:
        return {"layout": self.layout.__dict__ | {"label": self.layout.label()},
                "fits": self.fits, "memory_bytes": self.memory_bytes,
                "capacity_bytes": self.capacity_bytes, "step_s": self.step_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
                "hfu": self.hfu, "inter_share": self.inter_share, "binding": self.binding,
                "memory": [t.to_json() for t in self.memory],
                "time": [t.to_json() for t in self.time]}


def _rank_layers(model: Decoder, pp: int, logits_layers: float) -> float:
    """Layer-equivalents of work on the busiest rank: the last stage carries the logits, so
    it gets k layers where k balances ``k + logits`` against ``ceil((L-k)/(p-1))``."""
    if pp == 1:
        return model.layers + logits_layers
    best = float("inf")
    for k in range(0, stage_layers(model, pp) + 1):
        others = -(-(model.layers - k) // (pp - 1))
        best = min(best, max(k + logits_layers, float(others)))
    return best


def predict(model: Decoder, net: Cluster, training: Training, layout: Layout) -> Prediction:
    """Every term of one layout (see the module docstring for the step model)."""
    t, p, d, v, m = layout.tp, layout.pp, layout.dp, layout.virtual, layout.microbatches
    s, h = model.seq, model.hidden
    memory = memory_terms(model, training, layout)
    peak = net.gpu.peak(training.precision)
    rate = peak * net.gpu.mamf * COMPUTE_EFFICIENCY
    tokens_mb = layout.micro_batch * s
    # 1. compute per microbatch on the busiest rank
    layer_flops = 6 * model.layer_matmul_params + 12 * s * h  # per token, fwd + bwd
    extra = {"none": 0.0, "full": 2 * model.layer_matmul_params + 4 * s * h,
             "selective": 0.0 if training.flash_attention else 4 * s * h}[layout.recompute]
    logits_layers = 6 * model.vocab * h / layer_flops
    work = _rank_layers(model, p, logits_layers)
    layers_here = work - (logits_layers if p == 1 else 0.0)
    compute_mb = work * layer_flops * tokens_mb / t / rate
    recompute_mb = min(layers_here, stage_layers(model, p)) * extra * tokens_mb / t / rate
    fixed_mb = stage_layers(model, p) * net.gpu.layer_s  # per-op work: not split by tp
    # 2. tensor parallelism: collectives per layer on the critical path
    message = tokens_mb * h * training.value_bytes
    t_ar, tp_inter = allreduce_time(message, t, 1, net)
    count = 6 if layout.recompute == "full" else 4
    tp_mb = stage_layers(model, p) * count * t_ar
    # 3. pipeline: slots, bubble, p2p
    busy_mb = compute_mb + recompute_mb + fixed_mb
    slot = (busy_mb + tp_mb) / v
    slots = v * m
    bubble = bubble_fraction(p, m, layout.schedule, v, "ideal") * slots * slot if p > 1 else 0.0
    crosses = t * p > net.per_node
    t_msg = p2p_time(message / t, crosses, net) if p > 1 else 0.0
    p2p = (p - 1) * 2 * t_msg + slots * max(0.0, 2 * t_msg - busy_mb / v)
    # 4. data parallelism / ZeRO
    n = params_on_gpu(model, layout)
    backward = 2 / 3 * busy_mb
    grad_s, dp_inter = allreduce_time(n * training.grad_bytes, d, t * p, net)
    gather_s, _ = allreduce_time(n * training.value_bytes, d, t * p, net)
    if layout.zero == 3:
        per_mb = gather_s + grad_s / 2  # 2 gathers (half an all-reduce each) + reduce-scatter
        dp_total, dp_exposed = m * per_mb, m * max(0.0, per_mb - busy_mb)
        dp_how = "m x max(0, 2 all-gathers + reduce-scatter - microbatch compute)"
    elif layout.zero == 2 and m > 1:  # sharded gradients cannot accumulate: reduce each one
        dp_total = m * grad_s / 2 + gather_s / 2
        dp_exposed = (m * max(0.0, grad_s / 2 - backward)
                      + max(0.0, gather_s / 2 - backward / 2))
        dp_how = "m reduce-scatters, each behind its backward; all-gather behind the next forward"
    elif layout.zero in (1, 2):
        dp_total = grad_s / 2 + gather_s / 2
        dp_exposed = max(0.0, grad_s / 2 - backward) + max(0.0, gather_s / 2 - backward / 2)
        dp_how = "reduce-scatter behind the last backward, all-gather behind the next forward"
    else:
        dp_total, dp_exposed = grad_s, max(0.0, grad_s - backward)
        dp_how = "all-reduce behind the last microbatch's backward"
    step = slots * slot + bubble + p2p + dp_exposed + net.gpu.step_s
    gpus = t * p * d
    # 5. ranks sharing cores: every rank's compute, added up, over the cores
    shared, total_work = 0.0, 0.0
    if net.cores is not None and gpus > net.cores:
        total_work = (d * m * ((model.layers + logits_layers) * layer_flops * tokens_mb / rate
                               + model.layers * extra * tokens_mb / rate
                               + t * model.layers * net.gpu.layer_s)
                      + gpus * net.gpu.step_s)
        shared = max(0.0, total_work / net.cores - step)
        step += shared
    tokens = layout.micro_batch * m * d * s
    model_flops = training_flops(int(model.matmul_params), 1, seq=s, attention_layers=model.layers,
                                 hidden=h) / s * tokens
    hw_flops = model_flops + model.layers * extra * tokens
    time = [
        Term("compute", m * compute_mb, f"{work:.1f} layer-equivalents x (6 N_layer + 12 s h) "
             f"x {tokens_mb} tokens / tp / (peak x MAMF {net.gpu.mamf:.2f} x "
             f"{COMPUTE_EFFICIENCY}) x m={m}", "training_flops (Kaplan 2020; PaLM appendix B)"),
        Term("recompute", m * recompute_mb, f"{layout.recompute}: extra forward FLOPs",
             "Korthikanti et al. 2022, section 5"),
        Term("tp", m * tp_mb, f"{count} collectives x {stage_layers(model, p)} layers x m of "
             f"{message / 1e6:.0f} MB over tp={t}" + (" (across nodes)" if t > net.per_node
                                                       else ""),
             "Shoeybi et al. 2019 (f / g); ring / hierarchical all-reduce"),
        Term("bubble", bubble, f"{layout.schedule} bubble (p-1)/({'v ' if v > 1 else ''}m) of "
             f"slots, p={p}, m={m}" + (f", v={v}" if v > 1 else ""),
             "bubble_fraction (Narayanan et al. 2021)"),
        Term("p2p", p2p, f"2 (p-1) hops of {message / t / 1e6:.1f} MB exposed, the rest behind "
             f"compute ({'inter' if crosses else 'intra'}-node)", "Narayanan et al. 2021, 4.1"),
        Term("dp", dp_exposed, f"{dp_how}: {dp_total:.3g} s in all, {dp_exposed:.3g} s exposed",
             "ZeRO paper section 7 volumes; nccl-tests ring factors"),
    ]
    if net.gpu.layer_s or net.gpu.step_s:
        time.insert(2, Term("fixed", m * fixed_mb + net.gpu.step_s,
                            f"{stage_layers(model, p)} layers x m={m} x {net.gpu.layer_s * 1e3:.3g} "
                            f"ms + {net.gpu.step_s * 1e3:.3g} ms a step", net.gpu.note))
    if net.cores is not None:
        time.append(Term("cores", shared, f"max(0, every rank's compute {total_work:.3g} s / "
                         f"{net.cores} cores - the step on a core each)" if shared else
                         f"{gpus} ranks on {net.cores} cores: each has its own",
                         "ranks that share a core run in turn"))
    pred = Prediction(layout, memory, time, net.gpu.memory_bytes, step,
                      tokens / step / gpus, model_flops / step / gpus / peak,
                      hw_flops / step / gpus / peak,
                      {"tp": tp_inter, "dp": dp_inter, "pp": 1.0 if crosses and p > 1 else 0.0})
    pred.binding = binding(pred, net)
    return pred


def binding(pred: Prediction, net: Cluster) -> str:
    """What limits this layout: the memory term that overflows, or the largest overhead."""
    if not pred.fits:
        big = max((t for t in pred.memory if t.name != "reserve"), key=lambda t: t.value)
        return (f"out of memory: {pred.memory_bytes / 1e9:.0f} GB > "
                f"{pred.capacity_bytes / 1e9:.0f} GB (largest: {big.name})")
    over = max((t for t in pred.time if t.name not in ("compute", "recompute", "fixed")),
               key=lambda t: t.value)
    share = over.value / pred.step_s
    if over.value <= 0.0:
        return "compute (no overhead exposed)"
    if over.name == "cores":
        return f"ranks share {net.cores} cores ({share:.0%} of the step)"
    if over.name == "tp" and pred.layout.tp > net.per_node:
        return f"TP across nodes ({share:.0%} of the step)"
    if over.name == "dp" and pred.inter_share.get("dp", 0.0) > 0.5:
        return f"DP reduction on the {net.inter.name} link ({share:.0%} of the step)"
    recompute = next(t for t in pred.time if t.name == "recompute")
    if recompute.value > over.value:
        return f"recomputation ({recompute.value / pred.step_s:.0%} of the step)"
    return f"{over.name} ({share:.0%} of the step)"


def _divisors(n: int, limit: int) -> list[int]:
    return [k for k in range(1, min(n, limit) + 1) if n % k == 0]


def layouts(model: Decoder, net: Cluster, training: Training) -> Iterator[list[Layout]]:
    """Candidate layouts, grouped: each group shares dp, tp, pp, schedule and microbatch and
    differs only in ZeRO stage and recomputation (the planner keeps the best of each).
    Pruned: tp a power of two dividing the heads, at most two nodes wide; pp at most L;
    interleaving with v in (2, 4, 8) and p v <= L + 2 chunks (Llama 3 gives the embedding and
    the head chunks of their own, section 3.3.2); ZeRO-3 only without
    a pipeline (DeepSpeed refuses it there)."""
    sequences = int(training.global_batch_tokens // model.seq)
    if sequences < 1:
        raise ConfigError(f"global_batch_tokens ({training.global_batch_tokens:g}) must hold at "
                          f"least one sequence of {model.seq} tokens; e.g. "
                          f"global_batch_tokens={model.seq * 512}")
    levels = RECOMPUTE if training.recompute is None else (training.recompute,)
    tp = 1
    while tp <= min(model.heads, 2 * net.per_node, net.gpus):
        if model.heads % tp == 0 and net.gpus % tp == 0:
            for pp in _divisors(net.gpus // tp, model.layers):
                dp = net.gpus // (tp * pp)
                if sequences % dp:
                    continue
                for mb in MICRO_BATCHES:
                    if (sequences // dp) % mb:
                        continue
                    m = sequences // dp // mb
                    schedules = [("1f1b", 1)] + [("interleaved", v) for v in VIRTUAL
                                                 if pp > 1 and pp * v <= model.layers + 2]
                    zeros = (0,) if dp == 1 else (0, 1, 2, 3) if pp == 1 else (0, 1, 2)
                    for schedule, v in schedules:
                        yield [Layout(dp, tp, pp, mb, m, schedule, v, z, r)
                               for z in zeros for r in levels]
        tp *= 2


TIE = 1e-9
"""Predictions whose tokens/s differ by less than this share are equal (float rounding: a
recomputation that lengthens the backward can hide exactly as much communication as it
adds, and the two sums round differently)."""


def fastest(preds: list[Prediction]) -> Prediction:
    """The fastest of ``preds``; of equally fast ones (``TIE``) the one that recomputes
    least, then shards least (the lowest ZeRO stage): a planner never recommends
    recomputing, or sharding, what it gains nothing from."""
    top = max(q.tokens_per_s_per_gpu for q in preds)
    return min((q for q in preds if q.tokens_per_s_per_gpu >= top * (1 - TIE)),
               key=lambda q: (RECOMPUTE.index(q.layout.recompute), q.layout.zero))


def plan(model: Decoder, net: Cluster, training: Training) -> list[Prediction]:
    """Every candidate's best variant (``fastest`` of those that fit), fitting ones first
    by tokens/s, then the rest."""
    out = []
    for group in layouts(model, net, training):
        preds = [predict(model, net, training, layout) for layout in group]
        fitting = [q for q in preds if q.fits]
        out.append(fastest(fitting) if fitting else min(preds, key=lambda q: q.memory_bytes))
    if not out:
        raise ConfigError(f"no layout of {net.gpus} GPUs divides the global batch of "
                          f"{training.global_batch_tokens:g} tokens ({model.seq}-token "
                          f"sequences); e.g. a power of two of sequences, "
                          f"global_batch_tokens={model.seq * 1024}")
    out.sort(key=lambda q: (not q.fits, -q.tokens_per_s_per_gpu))
    return out


def by_shape(preds: list[Prediction]) -> list[Prediction]:
    """The best prediction of each dp x tp x pp, in the order of ``preds``."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for q in preds:
        key = (q.layout.dp, q.layout.tp, q.layout.pp)
        if key not in seen:
            seen.add(key)
            out.append(q)
    return out


def rank_of(preds: list[Prediction], *, dp: int, tp: int, pp: int) -> int:
    """1-based rank of the shape dp x tp x pp among ``by_shape(preds)``; 0 if absent."""
    for i, q in enumerate(by_shape(preds), 1):
        if (q.layout.dp, q.layout.tp, q.layout.pp) == (dp, tp, pp):
            return i
    return 0


def with_layout(model: Decoder, net: Cluster, training: Training, **fixed: int) -> Prediction:
    """The best fitting (else smallest) prediction among layouts whose fields equal
    ``fixed`` (e.g. ``dp=6, tp=8, pp=64``): how the planner rates a published layout."""
    preds = [predict(model, net, training, replace(layout))
             for group in layouts(model, net, training) for layout in group
             if all(getattr(layout, k) == v for k, v in fixed.items())]
    if not preds:
        raise ConfigError(f"no candidate layout has {fixed}; e.g. dp * tp * pp = {net.gpus}")
    fitting = [q for q in preds if q.fits]
    if fitting:
        return fastest(fitting)
    return min(preds, key=lambda q: q.memory_bytes)
