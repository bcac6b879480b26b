"""The experiments lesson 13 runs: your own 3D run beside the planner, then the planner at scale.

Teaches how one model of memory and time (``labkit.theory.plan``) carries from a 4-rank run
on a laptop to a node of 8 GPUs, to 1,024 H100s and to Llama 3 405B on 16,384 H100s (Llama
Team 2024, "The Llama 3 Herd of Models", Table 4 and section 3.3.2), and to the seeds'
examples (seed 000: a 3B model on 4 x 24 GB, options A and B; seed 003: a model that needs
about 320 GB on 8-GPU nodes of 80 GB). Every sentence here is computed from the numbers it
speaks about; the notebook stays a few lines per cell. Figures: ``labkit.visuals.plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from labkit.config.run import ModelConfig
from labkit.launchers.results import RunResult
from labkit.lessons.parallel3d import BATCH, LESSON_GPT, MICROBATCHES, run_3d
from labkit.theory.plan import Prediction, plan, predict, rank_of, with_layout
from labkit.theory.plan_models import GPUS, Cluster, Decoder, Training, cluster, get_model
from labkit.theory.plan_terms import Layout, memory_terms

STATE_TERMS = ("params", "grads", "optimizer")
"""The model-state terms of a prediction (what a run's ``per_rank_bytes`` measures)."""


@dataclass(frozen=True, kw_only=True)
class Published:
    """A layout a team published, with its measured utilisation and where it says so."""

    dp: int
    """Data-parallel replicas."""
    tp: int
    """Tensor-parallel width."""
    pp: int
    """Pipeline stages."""
    mfu: float
    """Model FLOPs utilisation the paper reports (bf16 dense peak)."""
    source: str
    """Paper and table."""


LLAMA3_405B_16K = Published(dp=128, tp=8, pp=16, mfu=0.41,
                            source="Llama Team 2024, Table 4 (16,384 H100s, 8K sequence)")
LLAMA3_TOKENS = 2048 * 8192
"""Llama 3 405B's global batch at 16K GPUs: 16M tokens (section 3.4.1, Table 4)."""


def lesson_decoder(model: ModelConfig = LESSON_GPT, vocab: int | None = None) -> Decoder:
    """The lesson GPT as the planner counts it (biases, LayerNorms, learned positions)."""
    if vocab is None:
        from labkit.train.data.text import vocab_size_of

        vocab = vocab_size_of(model.vocab_size)
    return Decoder("lesson-gpt", model.depth, model.width, model.heads, model.heads,
                   4 * model.width, False, vocab, model.seq_len, bias=True, learned_positions=True)


def lesson_training(optimizer: str = "momentum") -> Training:
    """What ``run_3d`` trains with: fp32, momentum SGD, ``BATCH`` sequences a step."""
    return Training(global_batch_tokens=BATCH * LESSON_GPT.seq_len, precision="fp32",
                    optimizer=optimizer, fp32_grads=True, recompute="none")


def own_run(dp: int = 1, pp: int = 2, tp: int = 2) -> RunResult:
    """Your 3D run: the lesson GPT on dp x pp x tp real ranks (lesson 09's ``run_3d``)."""
    return run_3d(dp, pp, tp, steps=3)


def own_layout(dp: int = 1, pp: int = 2, tp: int = 2) -> Layout:
    """The planner's layout of ``own_run``: each replica's ``BATCH`` sequences (labkit's
    batch size is per data-parallel rank) in ``MICROBATCHES``."""
    return Layout(dp, tp, pp, BATCH // MICROBATCHES, MICROBATCHES)


def own_rows(result: RunResult, layout: Layout) -> list[dict[str, Any]]:
    """Model state of the fullest rank, term by term: the planner beside the run."""
    predicted = {t.name: t.value for t in memory_terms(lesson_decoder(), lesson_training(),
                                                         layout)}
    ranks = result.metrics["per_rank_bytes"]
    fullest = max(ranks, key=lambda b: sum(b[k] for k in STATE_TERMS))
    return [{"term": k, "planner_kB": predicted[k] / 1e3, "measured_kB": fullest[k] / 1e3,
             "ratio": predicted[k] / fullest[k]} for k in STATE_TERMS]


def own_text(rows: list[dict[str, Any]], model: ModelConfig = LESSON_GPT) -> str:
    """What the comparison says, from its numbers."""
    planner = sum(r["planner_kB"] for r in rows)
    measured = sum(r["measured_kB"] for r in rows)
    gap = planner / measured - 1
    side = "below" if gap < 0 else "above"
    extra = (measured - planner) * 1e3 / (4 * len(rows))  # fp32: 4 bytes per value and term
    return (f"The planner counts {planner:.1f} kB of model state on the fullest rank, the run "
            f"kept {measured:.1f} kB: {abs(gap):.1%} {side}, {extra:,.0f} parameters. The "
            f"planner splits every parameter by tp, as Megatron does (its embedding is "
            f"vocab-parallel); the run keeps the token and position embeddings and each "
            f"block's LayerNorms and row-parallel biases whole on both tensor-parallel ranks. "
            f"At width {model.width} those are a few percent of a rank; at width 16,384 a "
            f"rounding error.")


def ranked_rows(preds: list[Prediction], top: int = 5) -> list[dict[str, Any]]:
    """The planner's ranking as table rows (one per dp x tp x pp shape)."""
    from labkit.theory.plan import by_shape

    return [{"#": i, "layout": q.layout.label(), "GB/GPU": q.memory_bytes / 1e9,
             "fits": q.fits, "step_s": q.step_s, "tok/s/GPU": q.tokens_per_s_per_gpu,
             "MFU": q.mfu, "binding": q.binding}
            for i, q in enumerate(by_shape(preds)[:top], 1)]


def scale_plans(model: Decoder | None = None) -> dict[str, list[Prediction]]:
    """The lesson GPT, unchanged, planned on one 8-GPU H100 node and on 1,024 H100s, each
    with 8 sequences per GPU in a step (the global batch grows with the cluster)."""
    model = model or lesson_decoder()
    out = {}
    for gpus in (8, 1024):
        training = Training(global_batch_tokens=8 * gpus * model.seq)
        out[f"{gpus} H100"] = plan(model, cluster("h100-sxm", gpus), training)
    return out


def scale_text(plans: dict[str, list[Prediction]]) -> str:
    """What the best layout of each cluster spends its step on, from its terms."""
    lines = []
    for name, preds in plans.items():
        q = preds[0]
        compute = sum(t.value for t in q.time if t.name in ("compute", "recompute"))
        lines.append(f"{name}: best {q.layout.label()}; compute is {compute / q.step_s:.0%} of "
                     f"a {q.step_s * 1e6:.0f} us step, MFU {q.mfu:.2%}; binding: {q.binding}.")
    return "\n".join(lines)


def llama_plan(gpus: int = 16384) -> tuple[Decoder, Cluster, Training, list[Prediction]]:
    """Llama 3 405B on ``gpus`` H100s with Meta's 16M-token batch and 8K sequences."""
    model, net = get_model("llama3-405b"), cluster("h100-sxm", gpus)
    training = Training(global_batch_tokens=LLAMA3_TOKENS)
    return model, net, training, plan(model, net, training)


def llama_alternatives(model: Decoder, net: Cluster, training: Training,
                       pub: Published = LLAMA3_405B_16K) -> dict[str, Prediction]:
    """Meta's layout and one change per axis: each shows what that axis buys."""
    shapes = {"Meta's": (pub.dp, pub.tp, pub.pp),
              "TP 16 (two nodes)": (pub.dp, 2 * pub.tp, pub.pp // 2),
              "TP 4": (pub.dp, pub.tp // 2, 2 * pub.pp),
              "PP 8": (2 * pub.dp, pub.tp, pub.pp // 2),
              "no pipeline": (pub.dp * pub.pp, pub.tp, 1)}
    return {name: with_layout(model, net, training, dp=dp, tp=tp, pp=pp)
            for name, (dp, tp, pp) in shapes.items()}


def axis_text(alts: dict[str, Prediction], preds: list[Prediction],
              pub: Published = LLAMA3_405B_16K) -> str:
    """One line per alternative: its MFU against Meta's layout and what binds it."""
    meta = alts["Meta's"]
    place = rank_of(preds, dp=pub.dp, tp=pub.tp, pp=pub.pp)
    lines = [f"Meta's DP {pub.dp} x TP {pub.tp} x PP {pub.pp} ranks #{place} of "
             f"{len({(q.layout.dp, q.layout.tp, q.layout.pp) for q in preds})} shapes; predicted "
             f"MFU {meta.mfu:.1%} against the published {pub.mfu:.0%} "
             f"({meta.mfu / pub.mfu - 1:+.0%}), {meta.memory_bytes / 1e9:.0f} GB per GPU."]
    for name, q in alts.items():
        if name == "Meta's":
            continue
        if not q.fits:
            lines.append(f"{name}: does not fit, {q.binding}.")
        else:
            lines.append(f"{name}: MFU {q.mfu:.1%} ({q.mfu / meta.mfu - 1:+.0%} vs Meta's), "
                         f"{q.memory_bytes / 1e9:.0f} GB; binding: {q.binding}.")
    return "\n".join(lines)


def seed_3b() -> tuple[Decoder, Cluster, Training]:
    """Seed 000's 3B model (GPT-3 2.7B's width, 36 layers) in bf16 with Adam on 4 x 24 GB."""
    from labkit.theory.activations import GPT_3B

    model = Decoder("gpt-3b", GPT_3B.layers, GPT_3B.hidden, GPT_3B.heads, GPT_3B.heads,
                    4 * GPT_3B.hidden, False, GPT_3B.vocab, 2048, bias=True,
                    learned_positions=True)
    gpu = replace(GPUS["a100-40gb"], name="24 GB GPU", memory_bytes=24e9)
    return model, Cluster(gpu, 4, 4, gpu.nvlink, gpu.nvlink), Training(
        global_batch_tokens=64 * 2048)


SEED_3B_OPTIONS = {"pure DP": Layout(4, 1, 1, 1, 16, zero=0, recompute="none"),
                   "A: DP 4 + ZeRO-2 + checkpointing": Layout(4, 1, 1, 1, 16, zero=2,
                                                               recompute="full"),
                   "B: PP 2 x DP 2 + ZeRO-1": Layout(2, 1, 2, 1, 32, zero=1, recompute="full")}
"""Seed 000's options for the 3B model (exercise 2), as planner layouts."""


def seed_3b_options() -> dict[str, Prediction]:
    """The planner's verdict on each of seed 000's options."""
    model, net, training = seed_3b()
    return {name: predict(model, net, training, lay) for name, lay in SEED_3B_OPTIONS.items()}


def options_text(options: dict[str, Prediction]) -> str:
    """Which options fit and which is faster, from the predictions."""
    lines = [f"{name}: {q.memory_bytes / 1e9:.1f} GB of {q.capacity_bytes / 1e9:.0f} GB "
             f"({'fits' if q.fits else 'does not fit'}), "
             + (f"{q.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {q.mfu:.1%}"
                if q.fits else q.binding) for name, q in options.items()]
    fitting = {n: q for n, q in options.items() if q.fits}
    if len(fitting) >= 2:
        (fast, a), (slow, b) = sorted(fitting.items(), key=lambda kv: -kv[1].tokens_per_s_per_gpu)[:2]
        lines.append(f"Faster: {fast}, by {a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu - 1:.0%}"
                     f" over {slow}.")
    return "\n".join(lines)


def seed_320gb() -> tuple[Decoder, Cluster, Training, list[Prediction]]:
    """Seed 003's "model that needs about 320 GB to train" (a 44-layer, 6144-wide GPT: 16
    bytes per parameter) on four 8-GPU nodes of A100 80 GB."""
    model = Decoder("gpt-20b", 44, 6144, 48, 48, 4 * 6144, False, 51200, 2048, bias=True,
                    learned_positions=True)
    net, training = cluster("a100-80gb", 32), Training(global_batch_tokens=512 * 2048)
    return model, net, training, plan(model, net, training)


def seed_320gb_text(model: Decoder, net: Cluster, training: Training,
                   preds: list[Prediction]) -> str:
    """Why the best layout of the 320 GB model looks the way it does, and the textbook
    answer (TP inside a node, the rest across nodes) beside it, from their terms."""
    best = preds[0]
    lines = [f"{model.params / 1e9:.1f}B parameters x 16 B = {model.params * 16 / 1e9:.0f} GB "
             f"of model state: no single {net.gpu.memory_bytes / 1e9:.0f} GB GPU holds it.",
             f"Best: {best.layout.label()}: {best.memory_bytes / 1e9:.0f} GB per GPU, MFU "
             f"{best.mfu:.1%}; the data-parallel reduction spends "
             f"{best.inter_share.get('dp', 0.0):.0%} of its time between nodes; binding: "
             f"{best.binding}."]
    for tp in (net.per_node, 2 * net.per_node):
        q = with_layout(model, net, training, tp=tp)
        where = "inside a node" if tp <= net.per_node else "across two nodes"
        lines.append(f"TP {tp} ({where}): best {q.layout.label()}, "
                     f"{q.memory_bytes / 1e9:.0f} GB, MFU {q.mfu:.1%} "
                     f"({q.mfu / best.mfu - 1:+.0%} vs the best); binding: {q.binding}.")
    return "\n".join(lines)


def tp_collectives(result: RunResult, step: int = 1, rank: int = 0) -> int:
    """Tensor-parallel all-reduces ``rank`` issued in ``step``, counted from the trace."""
    from labkit.base.events import Op

    return sum(1 for e in result.timeline.events if e.rank == rank and e.step == step
               and e.op == Op.ALL_REDUCE and e.axis == "tp")


def tp_collectives_predicted(layout: Layout, model: Decoder | None = None) -> int:
    """The planner's count: 4 per layer (f and g, forward and backward) on a stage's layers,
    for each of the step's microbatches (the ``tp`` term of ``labkit.theory.plan.predict``)."""
    from labkit.theory.plan_terms import stage_layers

    return 4 * stage_layers(model or lesson_decoder(), layout.pp) * layout.microbatches


def labkit_states(model: Decoder, gpus: int, training: Training) -> dict[tuple[int, int, int],
                                                                          float]:
    """The planner's model state (params + grads + optimizer, ZeRO-0) on the fullest GPU of
    every dp x tp x pp it enumerates for ``gpus`` GPUs: what the lesson's mechanism cell
    computes by hand."""
    from labkit.theory.plan import layouts

    net = cluster("h100-sxm", gpus)
    out = {}
    for group in layouts(model, net, training):
        lay = group[0]
        shape = (lay.dp, lay.tp, lay.pp)
        if shape not in out:
            terms = memory_terms(model, training, Layout(lay.dp, lay.tp, lay.pp, 1, 1))
            out[shape] = sum(t.value for t in terms if t.name in STATE_TERMS)
    return out
