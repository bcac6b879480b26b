"""Lesson 02's large-batch experiments from the notebook's side: start the runs, estimate,
and say what they showed in sentences computed from their numbers.

* ``noise_scale_experiment``: the simple noise scale ``B_simple`` of the lesson's model,
  measured during a real data-parallel run (McCandlish et al. 2018, Appendix A.1), and
  ``tradeoff_text``: what it predicts for the lesson's batch sizes (eq. 2.6 and 2.11).
* ``race_experiment`` / ``race_text``: momentum SGD vs LARS with the same linear LR rule,
  over several seeds; the verdict is a margin every seed must clear.
* ``resize_experiment``: an elastic resize (4 ranks -> 2) through labkit's own checkpoint
  and resume; the LR the ranks used after it, beside ``theory.lr_after_resize``.

Torch-free: the rank code is in ``labkit.lessons.large_batch``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

from labkit.lessons.machine import sharing_cores
from labkit.lessons.scaling import LESSON_MODEL, CurveRun
from labkit.theory import (
    examples_needed,
    optimal_lr,
    simple_noise_scale,
    steps_needed,
    trace_sigma,
    true_grad_sq,
)


@dataclass
class NoiseScale:
    """Per-step squared gradient norms of one data-parallel run, and the estimates."""

    per_rank_batch: int
    global_batch: int
    local_sq: list[float]
    global_sq: list[float]
    losses: list[float]

    def estimates(self, start: int, stop: int) -> tuple[float, float]:
        """Mean ``|G|^2`` and ``tr(Sigma)`` estimates over steps ``start:stop``."""
        pairs = list(zip(self.local_sq[start:stop], self.global_sq[start:stop], strict=True))
        b, big = self.per_rank_batch, self.global_batch
        g = sum(true_grad_sq(b, s, big, gl) for s, gl in pairs) / len(pairs)
        t = sum(trace_sigma(b, s, big, gl) for s, gl in pairs) / len(pairs)
        return g, t

    def b_simple(self, start: int = 0, stop: int | None = None) -> float:
        """``B_simple`` over a window (numerator and denominator averaged apart, as the
        paper does; nan if the window's ``|G|^2`` estimate is not positive)."""
        g, t = self.estimates(start, len(self.losses) if stop is None else stop)
        return simple_noise_scale(max(t, 0.0), g) if g > 0 else float("nan")

    def windows(self, width: int = 20) -> list[tuple[int, float, float]]:
        """(middle step, mean loss, B_simple) for consecutive windows of ``width`` steps."""
        out = []
        for a in range(0, len(self.losses) - width + 1, width):
            loss = sum(self.losses[a:a + width]) / width
            out.append((a + width // 2, loss, self.b_simple(a, a + width)))
        return out


def noise_scale_experiment(*, world_size: int = 2, per_rank_batch: int = 32, steps: int = 160,
                           lr: float = 0.8, seed: int = 0, timeout_s: float = 120.0) -> NoiseScale:
    """Plain SGD on the lesson's model over ``world_size`` real ranks, recording per step the
    local (``per_rank_batch``) and all-reduced (global batch) squared gradient norms."""
    from labkit.api import launch
    from labkit.lessons.large_batch import noise_scale_run

    r = launch(noise_scale_run, world_size, steps, per_rank_batch, lr, seed,
               timeout_s=timeout_s, threads_per_rank=1, trace=False).results[0]
    return NoiseScale(r["per_rank_batch"], r["global_batch"], r["local_sq"], r["global_sq"],
                      r["losses"])


def tradeoff_text(b_noise: float, batches: list[int]) -> str:
    """What the measured noise scale predicts at each batch: steps and samples against their
    minimum, and the best LR as a share of the largest useful one (McCandlish et al. 2018)."""
    lines = [f"B_noise (measured, late in the run) = {b_noise:.0f} samples",
             f"{'global batch':>12}  {'steps / S_min':>13}  {'samples / E_min':>15}  "
             f"{'best LR / LR_max':>16}"]
    for b in batches:
        lines.append(f"{b:>12}  {steps_needed(b, b_noise):>13.2f}  "
                     f"{examples_needed(b, b_noise):>15.2f}  {optimal_lr(b, 1.0, b_noise):>16.2f}")
    below = [b for b in batches if b <= b_noise]
    above = [b for b in batches if b > 2 * b_noise]
    if below:
        lines.append(f"Up to about {b_noise:.0f} samples a bigger batch still buys fewer steps "
                     f"at a small price in samples, and the best LR grows almost in proportion: "
                     f"linear scaling works (batch {max(below)}: "
                     f"{examples_needed(max(below), b_noise):.2f} x the minimum samples).")
    if above:
        b = min(above)
        best = optimal_lr(b, 1.0, b_noise)
        lines.append(f"Past about 2 x B_noise the best LR barely grows: at batch {b} it is "
                     f"{best:.2f} of LR_max, {best / 0.5:.1f} x its value at B_noise, where the "
                     f"linear rule would multiply the LR by {b / b_noise:.1f}; samples cost "
                     f"{examples_needed(b, b_noise):.1f} x the minimum. "
                     f"Linear scaling stops paying here.")
    return "\n".join(lines)


RACE_LRS = {"momentum": 0.003, "lars": 1.0}
"""LRs at global batch 32 (2 ranks x 16). On the layered model both reach about the same loss
in 240 steps there (the race re-measures it); each is then scaled by the same linear rule."""


@dataclass
class Race:
    """Momentum SGD vs LARS at a small and a large batch; every run a real 2-rank job."""

    results: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)

    def final(self, optimizer: str, global_batch: int) -> dict[int, float]:
        """Seed -> mean loss over the last eighth of that run."""
        out = {}
        for r in self.results:
            if r["optimizer"] == optimizer and r["global_batch"] == global_batch:
                k = max(1, len(r["losses"]) // 8)
                out[r["seed"]] = sum(r["losses"][-k:]) / k
        return out

    def gaps(self) -> dict[int, float]:
        """Seed -> SGD's final loss minus LARS's, at the large batch (positive: LARS ahead)."""
        big = self.settings["big_batch"]
        sgd, lars = self.final("momentum", big), self.final("lars", big)
        return {s: sgd[s] - lars[s] for s in lars}

    def lars_wins(self) -> bool:
        """LARS ends below SGD by at least the margin on every seed."""
        return min(self.gaps().values()) >= self.settings["margin"]

    def curves(self, seed: int = 0) -> dict[str, CurveRun]:
        """One seed's runs as curves for ``plot_loss_curves`` (x axis: samples)."""
        out = {}
        for r in self.results:
            if r["seed"] == seed:
                name = f"{r['optimizer']}, batch {r['global_batch']}, LR {r['lr']:g}"
                out[name] = CurveRun(name=name, world_size=2, global_batch=r["global_batch"],
                                     lr=r["lr"], losses=r["losses"], lrs=[], grad_norms=[],
                                     wall_s=0.0, warmup_steps=r["warmup_steps"])
        return out


def race_experiment(*, seeds: tuple[int, ...] = (0, 1, 2), small: int = 16, big: int = 512,
                    small_steps: int = 240, big_steps: int = 40, warmup_steps: int = 5,
                    lrs: dict[str, float] | None = None, scale: float = 10.0,
                    margin: float = 0.1, timeout_s: float = 300.0) -> Race:
    """On 2 ranks: each optimizer once at ``2 x small`` (seed ``seeds[0]``), then at
    ``2 x big`` for every seed with its LR scaled by ``big / small`` and a warmup."""
    from labkit.api import launch
    from labkit.lessons.large_batch import layerwise_race

    base = lrs or RACE_LRS
    runs = [{"optimizer": o, "seed": seeds[0], "per_rank_batch": small, "steps": small_steps,
             "lr": lr, "warmup_steps": 0} for o, lr in base.items()]
    runs += [{"optimizer": o, "seed": s, "per_rank_batch": big, "steps": big_steps,
              "lr": lr * big / small, "warmup_steps": warmup_steps}
             for s in seeds for o, lr in base.items()]
    res = launch(layerwise_race, 2, runs, scale, timeout_s=timeout_s, threads_per_rank=1,
                 trace=False)
    return Race(res.results[0], {"seeds": seeds, "small_batch": 2 * small, "big_batch": 2 * big,
                                 "margin": margin, "scale": scale})


def race_text(race: Race) -> str:
    """The race's table and verdict, from its numbers."""
    small, big, margin = (race.settings[k] for k in ("small_batch", "big_batch", "margin"))
    lines = []
    for batch in (small, big):
        for opt in ("momentum", "lars"):
            finals = race.final(opt, batch)
            lr = next(r["lr"] for r in race.results
                      if r["optimizer"] == opt and r["global_batch"] == batch)
            shown = ", ".join(f"seed {s}: {v:.3f}" for s, v in finals.items())
            lines.append(f"batch {batch:>5}  {opt:<9} LR {lr:<7g} final loss  {shown}")
    gaps = race.gaps()
    worst = min(gaps, key=lambda s: gaps[s])
    if race.lars_wins():
        lines.append(f"At batch {big} LARS ends below momentum SGD on every seed, by at least "
                     f"{gaps[worst]:.2f} (seed {worst}; margin {margin}): it holds here.")
    else:
        lines.append(f"At batch {big} LARS does not beat momentum SGD by {margin} on every seed "
                     f"(seed {worst}: {gaps[worst]:+.2f}): not shown by this run.")
    s_small = race.final("momentum", small)
    l_small = race.final("lars", small)
    seed = next(iter(l_small))
    lines.append(f"At batch {small} the two ended {abs(s_small[seed] - l_small[seed]):.2f} apart "
                 f"(seed {seed}).")
    return "\n".join(lines)


def resize_experiment(*, old_world: int = 4, new_world: int = 2, per_rank_batch: int = 16,
                      base_lr: float = 0.2, steps_before: int = 8, steps_after: int = 8,
                      timeout_s: float = 120.0) -> dict[str, Any]:
    """Train on ``old_world`` ranks with the linear rule, checkpoint, lose ranks, resume on
    ``new_world`` from that checkpoint (DCP reshards it); the LRs each part used."""
    from labkit.api import run
    from labkit.config.run import RunConfig

    common: dict[str, Any] = {"strategy": "scaling", "batch_size": per_rank_batch,
                              "lr": base_lr, "model": LESSON_MODEL, "progress": False,
                              "backend": "gloo", "timeout_s": timeout_s}
    # the lesson says that 4 ranks share 2 cores; the checkpoints go with the experiment
    with sharing_cores(), tempfile.TemporaryDirectory(prefix="labkit-resize-") as root:
        opts = {"lr_rule": "linear", "base_batch": per_rank_batch, "checkpoint_dir": root,
                "checkpoint_every": steps_before}
        before = run(RunConfig(world_size=old_world, steps=steps_before, options=opts, **common))
        after = run(RunConfig(world_size=new_world, steps=steps_before + steps_after,
                              options={**opts, "resume": True}, **common))
    return {"old_world": old_world, "new_world": new_world,
            "lr_before": before.outputs[0].extra["lr"], "lr_after": after.outputs[0].extra["lr"],
            "resumed_from": after.outputs[0].extra["first_step"],
            "batch_before": before.metrics["global_batch"],
            "batch_after": after.metrics["global_batch"],
            "losses": before.losses + after.losses}
