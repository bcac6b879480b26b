"""The lesson-02 experiments as functions: each one starts real runs and returns the record.

1. ``lr_experiment``: 1 rank vs N ranks at the same per-rank batch, compared at the same
   number of *samples* seen — (a) LR unscaled, (b) linear scaling, (c) scaling + warmup,
   (d) a far too large LR, without and with gradient clipping (Goyal et al. 2017).
2. ``accumulation_check``: N ranks x accumulation vs one process on the whole global
   batch; the max abs weight difference must be <= 1e-6.
3. ``optimizer_comparison``: SGD, Adam, LARS and LAMB at one large global batch.

Every curve comes from real ranks over gloo; variants with the same world size share one
launch (``record_variants``) so start-up is paid once. Nothing is simulated.
Torch-free: this module runs in the notebook's process and only starts ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from labkit.base.errors import ConfigError
from labkit.config.run import ModelConfig, RunConfig
from labkit.theory import global_batch, scaled_lr

LESSON_MODEL = ModelConfig(depth=2, width=128)
"""Small enough for 4 ranks on 2 cores; the loss falls visibly within a few thousand samples."""


@dataclass
class CurveRun:
    """One recorded run: loss per optimizer step and what the step cost in samples."""

    name: str
    world_size: int
    global_batch: int
    lr: float
    """Target LR after scaling (the warmup ramps up to it)."""
    losses: list[float]
    lrs: list[float]
    grad_norms: list[float]
    wall_s: float
    clip: float = 0.0
    warmup_steps: int = 0

    @property
    def samples(self) -> list[int]:
        """Samples seen after each step (x axis of the comparison)."""
        return [(i + 1) * self.global_batch for i in range(len(self.losses))]

    def final_loss(self, window: float = 0.125) -> float:
        """Mean loss over the last ``window`` share of the run (nan if it diverged)."""
        k = max(1, round(len(self.losses) * window))
        tail = self.losses[-k:]
        return sum(tail) / k if all(math.isfinite(v) for v in tail) else math.nan

    @property
    def diverged(self) -> bool:
        finite = [v for v in self.losses if math.isfinite(v)]
        return len(finite) < len(self.losses) or max(finite, default=0) > 10 * self.losses[0]


@dataclass
class Experiment:
    """A set of runs sharing one budget of samples, plus the settings that produced them."""

    runs: dict[str, CurveRun]
    settings: dict[str, Any] = field(default_factory=dict)

    def table(self) -> list[dict[str, Any]]:
        return [{"run": r.name, "ranks": r.world_size, "global_batch": r.global_batch,
                 "target_lr": r.lr, "steps": len(r.losses), "final_loss": r.final_loss(),
                 "max_loss": max((v for v in r.losses if math.isfinite(v)), default=math.nan),
                 "diverged": r.diverged} for r in self.runs.values()]


    def text(self) -> str:
        """The table as aligned text (print it in a notebook)."""
        head = f"{'run':<34}{'ranks':>6}{'batch':>7}{'LR':>8}{'steps':>7}{'final loss':>12}  diverged"
        lines = [head]
        for row in self.table():
            lines.append(f"{row['run']:<34}{row['ranks']:>6}{row['global_batch']:>7}"
                         f"{row['target_lr']:>8.3g}{row['steps']:>7}{row['final_loss']:>12.4f}  "
                         f"{row['diverged']}")
        return "\n".join(lines)

    def reading(self) -> str:
        """What the table shows, one computed sentence per comparison
        (``labkit.lessons.scaling_text``): which runs lag, land close or blow up."""
        from labkit.lessons.scaling_text import reading

        return reading(self.runs)


def _record(name: str, cfg: RunConfig) -> CurveRun:
    """One variant as its own ``labkit.run`` (what the CLI would do)."""
    from labkit.api import run

    res = run(cfg)
    extra = res.outputs[0].extra
    return CurveRun(name=name, world_size=cfg.world_size, global_batch=res.metrics["global_batch"],
                    lr=res.metrics["target_lr"], losses=res.losses, lrs=extra["lr"],
                    grad_norms=extra["grad_norm"], wall_s=res.wall_s,
                    clip=cfg.options.clip_grad_norm, warmup_steps=cfg.options.warmup_steps)


def record_variants(named: dict[str, RunConfig], timeout_s: float = 120.0
                    ) -> dict[str, CurveRun]:
    """Variants with the same world size trained in ONE launch (start-up paid once).

    Losses are averaged over ranks per step, exactly as ``labkit.run`` reports them.
    """
    from labkit.api import launch
    from labkit.base.progress import waiting
    from labkit.strategies.scaling.impl import run_variants

    by_world: dict[int, list[str]] = {}
    for name, cfg in named.items():
        by_world.setdefault(cfg.world_size, []).append(name)
    runs: dict[str, CurveRun] = {}
    for world, names in by_world.items():
        with waiting(f"training {len(names)} variant(s) on {world} rank(s): "
                     f"{', '.join(names)}", after_s=2.0):
            res = launch(run_variants, world, [named[n] for n in names], timeout_s=timeout_s,
                         threads_per_rank=1, trace=False, progress=False)  # said just above
        for i, name in enumerate(names):
            per_rank = [r[i] for r in res.results]
            cfg, first = named[name], per_rank[0]
            losses = [sum(v) / world for v in zip(*(r["losses"] for r in per_rank))]
            runs[name] = CurveRun(name=name, world_size=world, global_batch=first["global_batch"],
                                  lr=first["target_lr"], losses=losses, lrs=first["lr"],
                                  grad_norms=first["grad_norm"], wall_s=res.wall_s / len(names),
                                  clip=cfg.options.clip_grad_norm,
                                  warmup_steps=cfg.options.warmup_steps)
    return runs


def lr_experiment(*, world_size: int = 4, per_rank_batch: int = 16, base_lr: float = 0.2,
                  samples: int = 2560, warmup_steps: int = 3, too_large: float = 16.0,
                  clip: float = 1.0, model: ModelConfig = LESSON_MODEL, seed: int = 0,
                  timeout_s: float = 120.0) -> Experiment:
    """Six real runs on the same budget of ``samples``: 1 rank, then N ranks four ways.

    ``base_lr`` is tuned for 1 rank at ``per_rank_batch``; ``too_large`` multiplies the
    linearly scaled LR for the divergence runs.
    """
    big = global_batch(per_rank_batch, world_size)
    if samples % big or samples < big:
        raise ConfigError(f"samples ({samples}) must be a positive multiple of the global "
                          f"batch ({per_rank_batch} x {world_size} = {big}); e.g. samples={big * 40}")
    common: dict[str, Any] = {"strategy": "scaling", "batch_size": per_rank_batch, "lr": base_lr,
                              "model": model, "seed": seed, "timeout_s": timeout_s,
                              "progress": False, "backend": "gloo"}
    n = world_size
    plans: dict[str, dict[str, Any]] = {
        "1 rank": {"world_size": 1, "steps": samples // per_rank_batch, "options": {}},
        f"{n} ranks, LR unscaled": {"world_size": n, "options": {}},
        f"{n} ranks, linear scaling": {"world_size": n, "options": {"lr_rule": "linear"}},
        f"{n} ranks, linear + warmup": {"world_size": n, "options": {
            "lr_rule": "linear", "warmup_steps": warmup_steps}},
        f"{n} ranks, LR x{too_large:g} too large": {
            "world_size": n, "lr": base_lr * too_large, "options": {"lr_rule": "linear"}},
        f"{n} ranks, LR x{too_large:g} + clipping": {
            "world_size": n, "lr": base_lr * too_large,
            "options": {"lr_rule": "linear", "clip_grad_norm": clip}},
    }
    configs = {}
    for name, plan in plans.items():
        plan.setdefault("steps", samples // big)
        plan["options"] = {**plan["options"], "base_batch": per_rank_batch}
        configs[name] = RunConfig(**{**common, **plan})
    runs = record_variants(configs, timeout_s)
    return Experiment(runs, {"world_size": n, "per_rank_batch": per_rank_batch,
                             "base_lr": base_lr, "samples": samples,
                             "scaled_lr": scaled_lr(base_lr, per_rank_batch, big),
                             "warmup_steps": warmup_steps, "too_large": too_large,
                             "clip": clip})


def accumulation_check(*, world_size: int = 2, per_rank_batch: int = 16, accumulation: int = 4,
                       steps: int = 5, lr: float = 0.2, model: ModelConfig = LESSON_MODEL,
                       timeout_s: float = 120.0) -> dict[str, Any]:
    """N ranks x accumulation vs one process on the whole global batch (same samples)."""
    from labkit.api import run

    res = run(RunConfig(strategy="scaling", world_size=world_size, steps=steps,
                        batch_size=per_rank_batch, lr=lr, model=model, check_reference=True,
                        timeout_s=timeout_s, progress=None, backend="gloo",
                        options={"accumulation": accumulation}))
    return {"global_batch": res.metrics["global_batch"], "steps": steps,
            "max_abs_diff": res.metrics["max_abs_diff_vs_reference"], "losses": res.losses}


OPTIMIZER_LRS = {"sgd": 0.8, "adam": 0.01, "lars": 8.0, "lamb": 0.02}
"""LRs per optimizer at the large batch (SGD's is 0.2 linearly scaled from 16 to 64)."""


def optimizer_comparison(*, world_size: int = 2, per_rank_batch: int = 128, steps: int = 20,
                         lrs: dict[str, float] | None = None, model: ModelConfig = LESSON_MODEL,
                         timeout_s: float = 120.0) -> Experiment:
    """SGD, Adam, LARS, LAMB at one large global batch, each a real run."""
    configs = {name: RunConfig(strategy="scaling", world_size=world_size, steps=steps,
                               batch_size=per_rank_batch, lr=lr, optimizer=name, model=model,
                               timeout_s=timeout_s, progress=None, backend="gloo",
                               options={"warmup_steps": 2})
               for name, lr in (lrs or OPTIMIZER_LRS).items()}
    runs = record_variants(configs, timeout_s)
    return Experiment(runs, {"world_size": world_size, "per_rank_batch": per_rank_batch,
                             "steps": steps})
