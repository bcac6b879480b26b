"""Lesson 05's sentences: what this run's ZeRO stages, bf16 and checkpointing showed.

ZeRO (Rajbhandari et al. 2020) divides the optimizer state (stage 1), then the gradients
(2), then the parameters (3) by N_d, at DDP's communication for stages 1-2 and 1.5x for
stage 3; mixed precision halves the saved activations and activation checkpointing (Chen et
al. 2016) keeps only segment inputs, paying a second forward. Each rule is read here from
the runs' counted bytes (tensor storages between steps; saved-tensor hooks) and set beside
the formula. Bytes do not depend on how busy the machine is; times do, so a time that
contradicts a rule is explained rather than trusted. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from labkit.lessons.machine import load_now
from labkit.theory.rounding import run_tolerance

if TYPE_CHECKING:
    from labkit.analysis.claims import Verdict

STATES = ("params", "grads", "optimizer")


def model_states(metrics: Mapping[str, Any], rank: int = 0) -> tuple[float, float]:
    """Measured and predicted model-state bytes (params + grads + optimizer) of one rank."""
    got = sum(float(metrics["per_rank_bytes"][rank][k]) for k in STATES)
    want = sum(float(metrics["predicted_bytes"][k]) for k in STATES)
    return got, want


def zero_text(runs: Mapping[str, Any]) -> str:
    """Per ZeRO run: rank 0's model states against the first run's (stage 0, DDP), measured
    and predicted, its communication against DDP's, and its difference from one process."""
    base = model_states(next(iter(runs.values())).metrics)
    lines = []
    for label, r in runs.items():
        m = r.metrics
        got, want = model_states(m)
        diff = m.get("max_abs_diff_vs_reference")
        lines.append(f"{label}: {got / 1e6:.2f} MB per rank = {got / base[0]:.2f} of DDP's "
                     f"(predicted {want / base[1]:.2f}), comm {m['comm_ratio_vs_ddp']:.2f}x DDP"
                     + (f", |w - one process| {diff:.1g} (rounding reaches "
                        f"{run_tolerance(r.config):.0e})" if diff is not None else ""))
    ratios = [model_states(r.metrics)[0] for r in runs.values()]
    if all(b < a for a, b in zip(ratios, ratios[1:])):
        lines.append("each stage kept fewer bytes than the one before, as ZeRO says")
    else:
        lines.append("a stage kept no fewer bytes than the one before: with SGD (no optimizer "
                     "state) stage 1 has nothing to shard; otherwise report this run")
    return "\n".join(lines)


def peak_text(run: Any) -> str:
    """A ZeRO run's model states inside a step against what it keeps between steps, per rank,
    and, for the MLP, the difference set beside its largest layer (``layer_sizes``; each
    element the run's ``bytes_per_param`` of parameters, padded to a multiple of the ranks as the shards are):
    under ZeRO-3, that layer's parameters gathered whole, alive one layer at a time."""
    from labkit.strategies.zero.options import layer_sizes

    m, c = run.metrics, run.config
    kept = [sum(int(b[k]) for k in STATES) for b in m["per_rank_bytes"]]
    peaks = [int(p) for p in m["peak_model_state_bytes"]]
    extra = [p - k for p, k in zip(peaks, kept)]
    line = (f"kept between steps: {', '.join(f'{k / 1e3:,.1f}' for k in kept)} kB per rank; "
            f"inside a step the ranks peaked at {', '.join(f'{p / 1e3:,.1f}' for p in peaks)} kB")
    if c.model.kind not in ("mlp", "digits"):
        return line
    numel = max(layer_sizes(c.model))
    width = int(m["bytes_per_param"]["params"])  # 2 under bf16, 4 in fp32
    padded = -(-numel // c.world_size) * c.world_size
    more = ", ".join(f"{e / 1e3:,.1f}" for e in extra)
    if getattr(c.options, "stage", None) == 3 and {numel * width, padded * width} >= set(extra):
        return (f"{line}: {more} kB more, exactly the largest layer gathered whole "
                f"({numel:,} parameters x {width} B), held only from its all-gather to the end "
                f"of that layer's work")
    return (f"{line}: {more} kB more (the largest layer, whole, is {numel * width / 1e3:,.1f} kB: "
            f"{numel:,} parameters x {width} B)")


def precision_text(runs: Mapping[str, Any]) -> str:
    """fp32, bf16 and bf16 + checkpointing (keys of ``runs``, in that order): the saved
    activations (counted, beside the formula) and the step times (measured)."""
    (n32, r32), (n16, r16), (nck, rck) = list(runs.items())[:3]
    act = {k: float(r.metrics["saved_activation_bytes"][0]) for k, r in runs.items()}
    step = {k: r.step_time_s * 1e3 for k, r in runs.items()}
    lines = [f"{n16} saved {act[n16] / act[n32]:.2f} of {n32}'s activations (predicted "
             f"{r16.metrics['predicted_activation_bytes'] / r32.metrics['predicted_activation_bytes']:.2f}); "
             f"checkpointing kept {act[nck] / act[n16]:.2f} of {n16}'s (predicted "
             f"{rck.metrics['predicted_activation_bytes'] / r16.metrics['predicted_activation_bytes']:.2f})"]
    lines.append(f"step: {n16} {step[n16]:.1f} ms, {nck} {step[nck]:.1f} ms")
    speed = bf16_speed_text(r32, r16, n32, n16)
    if speed:
        lines.append(speed)
    verdict = recompute_verdict(runs)
    lines.append(verdict.sentence())
    (f16, k16), (fck, kck) = forward_s(r16), forward_s(rck)
    lines.append(f"the trace: {kck:g} forward spans a step with checkpointing against {k16:g} "
                 f"without, {fck * 1e3:.1f} ms of forward against {f16 * 1e3:.1f} ms; the step "
                 f"{step[nck] - step[n16]:+.1f} ms (one run each, where backward and the "
                 "wire vary too)")
    if not verdict.holds:
        from labkit.lessons.replayed import again

        load = load_now()
        lines.append("  " + again(RECOMPUTE, lambda a, b: forward_s(a)[0] / forward_s(b)[0],
                                  [rck, r16], verdict.sample.value))
        lines.append("one run of each, timed on a shared machine"
                     + (f" ({load.text()})" if load.busy else "")
                     + "; the bytes above do not depend on that")
    return "\n".join(lines)


def _peak_per_rank(run: Any) -> float | None:
    m = run.metrics
    peak = m.get("peak_flops_per_s")
    return float(peak) / max(1, int(m.get("peak_processes") or 1)) if peak else None


def bf16_speed_text(r32: Any, r16: Any, n32: str = "fp32", n16: str = "bf16") -> str:
    """bf16's step beside fp32's, and the two matmul peaks per rank each run divided by
    (``labkit.analysis.throughput``): on a CPU without bf16 units (AVX-512 BF16, AMX) torch's
    bf16 matmul is about 50-100x slower than fp32's (measured on an AVX2 host: 1.35 against
    72 GFLOP/s on one thread), so mixed precision there costs time and saves only memory.
    Empty where a run has no peak."""
    p32, p16 = _peak_per_rank(r32), _peak_per_rank(r16)
    if not p32 or not p16:
        return ""
    rate = p16 / p32
    head = (f"{n16}'s step took {r16.step_time_s / r32.step_time_s:.2f}x {n32}'s; this "
            f"machine's matmul peak per rank: bf16 {p16 / 1e9:.3g} GFLOP/s, fp32 "
            f"{p32 / 1e9:.3g} ({rate:.2g}x)")
    if rate < 0.5:
        return (f"{head}: a CPU without bf16 units (AVX-512 BF16, AMX) runs each bf16 matmul "
                "on a slow path, so here mixed precision saves memory and costs time; a GPU's "
                "tensor cores run bf16 far faster than fp32 (an A100: 312 TFLOP/s against "
                "19.5), which is why training uses it there")
    if rate > 1.5:
        return f"{head}: bf16 matmuls run faster than fp32 ones here, as on a GPU's tensor cores"
    return f"{head}: about fp32's rate here, so bf16 saves memory and bandwidth, not matmul time"


RECOMPUTE = "forward time per step, checkpointed / plain bf16"


def forward_s(run: Any) -> tuple[float, float]:
    """(seconds, spans) of forward in one step, the recompute inside backward included: the
    median over every rank and step but the first of the FORWARD spans' summed time, and of
    their count. Read from the trace, so backward's and the wire's noise are not in it."""
    import statistics

    from labkit.base.events import Op

    tl = run.timeline.window()
    per = [tl.select(rank=r, op=Op.FORWARD, step=s) for r in tl.ranks for s in tl.steps()]
    per = [spans for spans in per if spans]
    if not per:
        raise ValueError("the run's trace has no forward spans")
    return (statistics.median(sum(e.dur_ns for e in spans) / 1e9 for spans in per),
            statistics.median(len(spans) for spans in per))


def recompute_verdict(runs: Mapping[str, Any]) -> Verdict:
    """Checkpointing runs the forward again inside backward: the forward time per step of the
    checkpointed run over the plain bf16 one (the third and second of ``runs``), above 1 (one
    run each: ``one_run_ratio``). The forward, not the step: on a CPU without bf16 units the
    bf16 backward took 7-9x the forward (docs/benchmarks.md), so a second forward was 6 % of
    the step, inside what two single runs' steps differ by, while the trace's forward time
    doubled."""
    from labkit.analysis.claims import Claim, judge
    from labkit.lessons.measure import one_run_ratio

    (_, r16), (_, rck) = list(runs.items())[1:3]
    return judge(one_run_ratio(forward_s(rck)[0] / forward_s(r16)[0]),
                 Claim.above(1.0, "checkpointing runs the forward again inside backward"),
                 RECOMPUTE, fmt=".2f")


def plan_table(params: float, *, gpus: int, gpu_gb: float, shape: Any,
               precision: str = "mixed", optimizer: str = "adam") -> str:
    """Seed 000's exercise 2 with activations counted: GB per GPU for every ZeRO stage and
    recomputation level (``labkit.theory.fits`` with a ``TransformerShape``), then what the
    table says about recomputation, read from the same reports."""
    from labkit.theory import fits
    from labkit.theory.activations import RECOMPUTE

    reports = {(r, s): fits(params, gpus=gpus, gpu_gb=gpu_gb, stage=s, shape=shape,
                            recompute=r, precision=precision, optimizer=optimizer)
               for r in RECOMPUTE for s in range(4)}
    head = f"{'recompute':10} {'activations':>12}  " + "  ".join(f"ZeRO-{s:<7}" for s in range(4))
    lines = [f"GB per GPU of {gpu_gb:g} ({params:.3g} params, {gpus} GPUs, {precision} {optimizer}; "
             f"fits = x)", head]
    for r in RECOMPUTE:
        act = reports[(r, 0)].per_gpu_bytes["activations"] / 1e9
        cells = [f"{reports[(r, s)].per_gpu_bytes['total'] / 1e9:6.1f} {'x' if reports[(r, s)].fits else ' '}"
                 for s in range(4)]
        lines.append(f"{r:10} {act:9.1f} GB  " + "  ".join(f"{c:12}" for c in cells))
    plain = [s for s in range(4) if reports[("none", s)].fits]
    levels = {r: [s for s in range(4) if reports[(r, s)].fits] for r in RECOMPUTE}
    first = next((r for r in RECOMPUTE if levels[r]), None)
    if plain:
        lines.append(f"without recomputation ZeRO-{plain[0]} already fits")
    elif first is None:
        lines.append("no stage fits even with full recomputation: split the model (tp, pp)")
    else:
        lines.append(f"without recomputation no ZeRO stage fits (activations alone "
                     f"{reports[('none', 0)].per_gpu_bytes['activations'] / 1e9:.1f} GB); with "
                     f"{first} recomputation ZeRO-{', '.join(map(str, levels[first]))} fit, so "
                     f"activation checkpointing is needed")
    return "\n".join(lines)
