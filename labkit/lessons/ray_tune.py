"""Ray Tune sweeping lesson 02's learning-rate scaling (lesson 12).

Lesson 02 asked: when the global batch grows from ``base_batch`` to ``ranks x batch``, which
learning-rate rule (none, linear, sqrt; Goyal et al. 2017) and how much warmup train best on
the same budget of samples? Here Ray Tune runs that question as a grid of *trials*: each
trial is one real ``labkit.run`` of the ``scaling`` strategy (its own ranks, started by
labkit's supervisor from inside a Ray worker process), reports its final loss with
``tune.report``, and Tune keeps the table and picks the best configuration. Ray runs as many
trials at once as the cluster has CPUs for (``cpus_per_trial`` each), and a trial reuses the
process of the one before it (``reuse_actors``): its ``labkit.run`` then forks ranks from the
fork server that process already started, instead of importing torch again.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from typing import Any

from labkit.base.progress import waiting
from labkit.launchers.ray.session import ensure_ray
from labkit.lessons.scaling import LESSON_MODEL


def lr_trial(config: dict[str, Any]) -> None:
    """One Tune trial: a real data-parallel run; reports the mean loss of its last eighth."""
    from ray import tune

    import labkit

    res = labkit.run(strategy="scaling", world_size=config["ranks"], steps=config["steps"],
                     batch_size=config["batch"], lr=config["base_lr"], model=LESSON_MODEL,
                     progress=False, backend="gloo", threads_per_rank=1,
                     options={"lr_rule": config["lr_rule"], "base_batch": config["batch"],
                              "warmup_steps": config["warmup_steps"]})
    tail = res.losses[-max(1, len(res.losses) // 8):]
    tune.report({"final_loss": sum(tail) / len(tail), "target_lr": res.metrics["target_lr"],
                 "wall_s": res.wall_s})


def tune_lr_scaling(*, rules: tuple[str, ...] = ("none", "linear", "sqrt"),
                    warmups: tuple[int, ...] = (0, 3), ranks: int = 2, batch: int = 16,
                    base_lr: float = 0.2, steps: int = 30, cpus_per_trial: float = 1.0
                    ) -> dict[str, Any]:
    """Grid-search LR rule x warmup with Ray Tune; returns the table and the best config."""
    ensure_ray()
    from ray import tune

    storage = tempfile.mkdtemp(prefix="labkit-tune-")
    try:
        tuner = tune.Tuner(
            tune.with_resources(lr_trial, {"cpu": cpus_per_trial}),
            param_space={"lr_rule": tune.grid_search(list(rules)),
                         "warmup_steps": tune.grid_search(list(warmups)), "ranks": ranks,
                         "batch": batch, "base_lr": base_lr, "steps": steps},
            tune_config=tune.TuneConfig(metric="final_loss", mode="min", reuse_actors=True),
            run_config=tune.RunConfig(storage_path=storage, name="lr_scaling", verbose=0,
                                      progress_reporter=_quiet_reporter()))
        trials = len(rules) * len(warmups)
        with waiting(f"Ray Tune: {trials} trials of {ranks} ranks x {steps} steps", after_s=2.0), \
                contextlib.redirect_stdout(io.StringIO()):  # Tune's banner, not the lesson's
            grid = tuner.fit()
        rows = []
        for i in range(len(grid)):
            result = grid[i]
            if result.error:
                raise result.error
            config, metrics = dict(result.config or {}), dict(result.metrics or {})
            rows.append({"lr_rule": config["lr_rule"], "warmup_steps": config["warmup_steps"],
                         **{k: metrics[k] for k in ("target_lr", "final_loss", "wall_s")}})
        best = grid.get_best_result()
        best_config, best_metrics = dict(best.config or {}), dict(best.metrics or {})
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    rows.sort(key=lambda r: r["final_loss"])
    return {"rows": rows, "best": {k: best_config[k] for k in ("lr_rule", "warmup_steps")},
            "best_final_loss": best_metrics["final_loss"],
            "settings": {"ranks": ranks, "batch": batch, "base_lr": base_lr, "steps": steps}}


def _quiet_reporter() -> Any:
    """A Tune progress reporter that reports nothing (the lesson prints its own table;
    Tune's would be an HTML table refreshed in the notebook while the trials run)."""
    from ray.tune import ProgressReporter

    class Quiet(ProgressReporter):  # type: ignore[misc]
        def should_report(self, trials: Any, done: bool = False) -> bool:
            return False

        def report(self, trials: Any, done: bool, *sys_info: Any) -> None:
            return None

    return Quiet()


def tune_table(sweep: dict[str, Any]) -> str:
    """The sweep as aligned text, best first."""
    lines = [f"{'LR rule':<9}{'warmup':>7}{'target LR':>11}{'final loss':>12}{'wall s':>8}"]
    for r in sweep["rows"]:
        lines.append(f"{r['lr_rule']:<9}{r['warmup_steps']:>7}{r['target_lr']:>11.3g}"
                     f"{r['final_loss']:>12.4f}{r['wall_s']:>8.1f}")
    return "\n".join(lines)
