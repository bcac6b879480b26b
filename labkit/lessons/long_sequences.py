"""Lesson 14's helpers: long sequences and many experts, with the run's own numbers.

What the lesson measures, and where the formulas come from:

* activation memory per layer against the sequence (Korthikanti et al. 2022, eqs. 1-3;
  ``labkit.theory.activations``) and ring attention's (``labkit.theory.context``);
* sequence parallelism (``labkit run hybrid --sequence-parallel``): the LayerNorms' bytes
  per rank and the tensor axis's traffic, with and without;
* ring attention step by step, read off a ring's trace on real ranks: at each ring step,
  which rank's keys every rank computed with, and what it sent meanwhile;
* zig-zag against plain chunking: the chunk blocks each rank computes at each ring step,
  counted by ``RingStats`` on real ranks, beside ``labkit.theory.context.blocks_per_step``;
* MoE routing over an ``ep`` axis: tokens per expert, dropped assignments, the all-to-all's
  bytes (``labkit.theory.experts``);
* Llama 3 405B's 4D layout (Llama Team 2024, "The Llama 3 Herd of Models", Table 4: TP 8 x
  CP 16 x PP 16 x DP 8 on 16,384 GPUs for 131,072-token sequences) and DeepSeek-V3's experts
  (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report": 256 routed experts per MoE layer, 8
  chosen per token, hidden 7168, 64-way expert parallelism over 8 nodes), read with the
  lab's formulas.
"""

from __future__ import annotations

from typing import Any

from labkit.base.events import Lane, Op

LESSON_GPT = {"kind": "gpt", "width": 32, "depth": 2, "heads": 4, "seq_len": 32}
"""A GPT small enough for 4 ranks on 2 cores: width 32, 2 blocks, 4 heads, 32 tokens."""
LLAMA3_405B = {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "seq": 131072,
               "tp": 8, "cp": 16, "pp": 16, "dp": 8}
"""Llama 3 405B's shape and its long-context layout (Llama 3 paper, Tables 3 and 4)."""
DEEPSEEK_V3 = {"hidden": 7168, "experts": 256, "top_k": 8, "ep": 64, "expert_inner": 2048}
"""DeepSeek-V3's MoE layer and its expert parallelism (DeepSeek-V3 report, sections 2-3)."""


def run_hybrid(steps: int = 2, batch_size: int = 8, progress: bool | None = None,
               **options: Any) -> Any:
    """``labkit.run(strategy="hybrid")`` on the lesson's GPT, checked against one process
    (its bar as ``labkit.run``'s: the check's one-process run makes it seconds)."""
    import labkit
    from labkit.lessons.machine import sharing_cores

    with sharing_cores():
        return labkit.run(strategy="hybrid", model=LESSON_GPT, steps=steps,
                          batch_size=batch_size, check_reference=True, progress=progress,
                          options={"microbatches": 2, **options})


def memory_rows(seqs: tuple[int, ...] = (2048, 8192, 32768, 131072)) -> list[dict[str, Any]]:
    """GB one Llama-3-405B-shaped layer keeps for backward per GPU (16-bit, batch 1), by
    sequence length (Korthikanti et al.'s counting): no parallelism, TP 8, TP 8 + SP, then
    with the s x s scores recomputed (flash or ring attention keep none), then the sequence
    split over cp 16 as well (every remaining term is per token)."""
    from labkit.theory import layer_activation_bytes

    L = LLAMA3_405B
    h, a, t, c = L["hidden"], L["heads"], L["tp"], L["cp"]
    rows = []
    for s in seqs:
        def gb(seq: int, **kw: Any) -> float:
            return layer_activation_bytes(seq, 1, h, a, **kw) / 1e9

        rows.append({"seq": s, "none GB": gb(s), "tp8 GB": gb(s, tp=t),
                     "tp8+sp GB": gb(s, tp=t, sequence_parallel=True),
                     "no scores GB": gb(s, tp=t, sequence_parallel=True, recompute="selective"),
                     "+cp16 GB": gb(s // c, tp=t, sequence_parallel=True,
                                    recompute="selective"),
                     "scores share": 5 * a * s / h / (34 + 5 * a * s / h)})
    return rows


def sp_rows(with_sp: Any, without: Any) -> list[dict[str, Any]]:
    """Per rank: the LayerNorms' activation bytes (measured, formula) and the tensor axis's
    bytes per step, for a TP run with and without sequence parallelism."""
    rows = []
    for name, r in (("tp2", without), ("tp2 + sp", with_sp)):
        m = r.metrics
        rows.append({"run": name, "LN bytes/rank": m["ln_activation_bytes_per_rank"][0],
                     "formula": int(m["predicted_ln_activation_bytes_per_rank"][0]),
                     "tp bytes/step": int(m["comm_bytes_per_axis"]["tp"]),
                     "predicted": int(m["predicted_comm_bytes_per_axis"]["tp"]),
                     "max |w - w1|": m["max_abs_diff_vs_reference"]})
    return rows


def ring_steps(timeline: Any, step: int = 0) -> list[dict[str, Any]]:
    """Ring attention's forward, step by step, from a trace (``zigzag_blocks``' run): for each
    ring step and rank, whose keys it computed with (the ``attn kvJ`` span), the K/V bytes it
    sent on to the next rank, and whether that send was posted before the compute began (the
    overlap: the bytes travel while the rank computes)."""
    computed: dict[tuple[int, int], Any] = {}
    sent: dict[tuple[int, int], Any] = {}
    for e in timeline.events:
        if e.step != step or e.chunk is None:
            continue
        if e.lane == Lane.COMM and e.op == Op.SEND and e.name == "kv":
            sent.setdefault((e.rank, e.chunk), e)
        elif e.op == Op.FORWARD and (e.name or "").startswith("attn kv"):
            computed.setdefault((e.rank, e.chunk), e)
    rows = []
    for (rank, chunk), span in sorted(computed.items()):
        send = sent.get((rank, chunk))
        rows.append({"ring step": chunk, "rank": rank, "computes with": span.name[5:],
                     "sends on (bytes)": int(send.bytes or 0) if send else 0,
                     "send posted first": "-" if send is None else
                     ("yes" if send.start_ns <= span.start_ns else "no")})
    return sorted(rows, key=lambda r: (r["ring step"], r["rank"]))


def zigzag_blocks(cp: int = 4, seq: int = 32) -> tuple[dict[str, Any], Any]:
    """Causal ring attention on ``cp`` real ranks, zig-zag (traced as step 0) and plain (step
    1): the chunk blocks each rank computed at each ring step (``RingStats``) beside
    ``theory.context.blocks_per_step``, and the run's timeline."""
    from labkit.api import launch
    from labkit.lessons.machine import sharing_cores
    from labkit.theory.context import blocks_per_step

    def count(ctx: Any) -> dict[str, list[int]]:
        import torch

        from labkit.train.parallel.ring_attention import Ring, ring_attention

        out = {}
        for step, (name, zz) in enumerate((("zigzag", True), ("plain", False))):
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 2, seq // cp, 8, generator=g) for _ in range(3))
            ring = Ring(ctx.comm, seq, causal=True, zigzag=zz, step=step)
            ring_attention(q, k, v, ring)
            out[name] = list(ring.stats.blocks_per_step)
        return out

    with sharing_cores():
        run = launch(count, cp)
    blocks = {name: {"measured": [m[name] for m in run.results],
                     "predicted": [blocks_per_step(r, cp, zigzag=name == "zigzag")
                                   for r in range(cp)]} for name in ("zigzag", "plain")}
    return blocks, run.timeline


def balance_text(blocks: dict[str, Any]) -> str:
    """What each layout's slowest rank computes against the mean, per ring run."""
    lines = []
    for name, b in blocks.items():
        per_rank = [sum(x) for x in b["measured"]]
        worst = [max(col) for col in zip(*b["measured"])]
        lines.append(f"{name:7s} blocks per rank {per_rank}; the ring waits for the busiest "
                     f"rank at each step: {sum(worst)} block-times against "
                     f"{sum(per_rank) / len(per_rank):.1f} on average "
                     f"({sum(worst) / (sum(per_rank) / len(per_rank)):.2f}x)")
    return "\n".join(lines)


def llama_lines() -> list[str]:
    """Llama 3 405B's long-context layout read with the lab's formulas."""
    from labkit.theory.context import ring_kv_block_bytes

    L = LLAMA3_405B
    gpus = L["tp"] * L["cp"] * L["pp"] * L["dp"]
    local = L["seq"] // L["cp"]
    kv = ring_kv_block_bytes(1, L["seq"], L["kv_heads"] // L["tp"], L["hidden"] // L["heads"],
                             L["cp"], 2)
    return [f"GPUs: tp {L['tp']} x cp {L['cp']} x pp {L['pp']} x dp {L['dp']} = {gpus:,}",
            f"tokens per cp rank: {L['seq']:,} / {L['cp']} = {local:,} (two zig-zag chunks "
            f"of {local // 2:,})",
            f"one K/V block a rank passes on per ring step and layer (bf16, "
            f"{L['kv_heads'] // L['tp']} KV head per TP rank): {kv / 1e6:.1f} MB, "
            f"{L['cp'] - 1} times a forward"]


def deepseek_lines(run: Any) -> list[str]:
    """DeepSeek-V3's dispatch per token beside what the lab's MoE run sent per token."""
    from labkit.theory.experts import expert_parallel_traffic

    m = run.metrics
    tokens = sum(m["tokens_per_expert"]) // run.config.options.top_k
    lab = m["comm_bytes_per_axis"]["ep"] / tokens
    d = DEEPSEEK_V3
    per_token = expert_parallel_traffic([d["top_k"]], d["hidden"], d["experts"], 0, 2)
    return [f"your run: {lab:,.0f} B on the ep axis per token routed (fp32, "
            f"top-{run.config.options.top_k}, width {LESSON_GPT['width']}, "
            f"{LESSON_GPT['depth']} layers, counts included)",
            f"DeepSeek-V3, one MoE layer, bf16: {per_token:,.0f} B per token (top-"
            f"{d['top_k']} of {d['experts']} experts, hidden {d['hidden']}, dispatch + combine, "
            f"forward + backward), with {d['experts'] // d['ep']} experts per GPU at ep "
            f"{d['ep']}"]
