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
                        f"{_rounding(r):.0e})" if diff is not None else ""))
    ratios = [model_states(r.metrics)[0] for r in runs.values()]
    if all(b < a for a, b in zip(ratios, ratios[1:])):
        lines.append("each stage kept fewer bytes than the one before, as ZeRO says")
    else:
        lines.append("a stage kept no fewer bytes than the one before: with SGD (no optimizer "
                     "state) stage 1 has nothing to shard; otherwise report this run")
    return "\n".join(lines)


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
    verdict = recompute_verdict(runs)
    lines.append(verdict.sentence())
    if verdict.holds:
        lines.append(f"the recomputed forward cost {step[nck] - step[n16]:.1f} ms per step")
    else:
        from labkit.lessons.replayed import again

        load = load_now()
        lines.append("  " + again(RECOMPUTE, lambda a, b: a.step_time_s / b.step_time_s,
                                  [rck, r16], verdict.sample.value))
        lines.append("one forward of this small model is a few ms, less than step times vary "
                     "between runs on a shared machine" + (f" ({load.text()})" if load.busy
                                                           else "")
                     + "; the bytes above do not depend on that")
    return "\n".join(lines)


RECOMPUTE = "checkpointed step / plain bf16 step"


def recompute_verdict(runs: Mapping[str, Any]) -> Verdict:
    """Checkpointing pays a second forward: the checkpointed step over the plain bf16 one
    (the second and third of ``runs``), above 1 (one run each: ``one_run_ratio``)."""
    from labkit.analysis.claims import Claim, judge
    from labkit.lessons.measure import one_run_ratio

    (_, r16), (_, rck) = list(runs.items())[1:3]
    return judge(one_run_ratio(rck.step_time_s / r16.step_time_s),
                 Claim.above(1.0, "checkpointing pays a second forward, so its step is longer"),
                 RECOMPUTE, fmt=".2f")


def _rounding(run: Any) -> float:
    """The lab's tolerance for "equals one process" for this run (``labkit.theory.rounding``)."""
    from labkit.theory.rounding import same_weights_tolerance

    c = run.config
    return same_weights_tolerance(c.optimizer, c.lr, c.steps)


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
