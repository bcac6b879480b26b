"""Figure of lesson 07: where a rank died, what was lost, and where the run resumed.

The top panel is a step axis: attempt 1 runs from step 0 until the injected fault kills a
rank (red x); its committed checkpoints are ticks; attempt 2 resumes at the last complete
checkpoint, so the steps between that checkpoint and the fault are done twice (hatched:
the work the failure cost). The bottom panel overlays the loss of the interrupted-and-resumed
run on an uninterrupted one: on CPU with a seed and the data order resumed they coincide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from labkit.analysis.plots import new_figure
from labkit.visuals.axes import log_ticks


@dataclass
class FaultStory:
    """What happened to one run, from real records (the failure and its timeline, the
    checkpoint directory, the resumed run)."""

    steps: int
    fault_rank: int
    fault_step: int
    checkpoints: list[int]
    """Steps of the complete checkpoints written (completed steps at save time)."""
    resumed_from: int
    """The step the second attempt started at (0 if there was no checkpoint yet)."""
    label: str = "labkit run ddp"
    reference_losses: list[float] = field(default_factory=list)
    resumed_losses: list[float] = field(default_factory=list)

    @property
    def lost_steps(self) -> int:
        """Steps computed twice because they were after the last checkpoint."""
        return self.fault_step - self.resumed_from


def plot_fault_timeline(story: FaultStory, *, attempts_label: Sequence[str] = (
        "attempt 1", "attempt 2 (resumed)")) -> Figure:
    """Two rows of steps (before / after the failure) and, if given, the two loss curves."""
    has_loss = bool(story.reference_losses and story.resumed_losses)
    fig = new_figure(figsize=(11, 5.5 if has_loss else 2.8))
    axes = fig.subplots(2 if has_loss else 1, 1, squeeze=False)[:, 0]
    ax = axes[0]
    # 1. attempt 1: steps 0 .. fault, then the kill
    ax.add_patch(Rectangle((0, 1.1), story.fault_step, 0.8, color="C0", alpha=0.7))
    ax.plot([story.fault_step], [1.5], "x", color="red", ms=14, mew=3,
            label=f"rank {story.fault_rank} killed at step {story.fault_step}")
    for c in story.checkpoints:
        ax.plot([c, c], [1.0, 2.0], color="black", lw=2)
    ax.plot([], [], color="black", lw=2, label="complete checkpoint")
    # 2. attempt 2: from the last checkpoint to the end; the redone span hatched
    ax.add_patch(Rectangle((story.resumed_from, 0.1), story.steps - story.resumed_from, 0.8,
                           color="C2", alpha=0.7))
    if story.lost_steps > 0:
        ax.add_patch(Rectangle((story.resumed_from, 0.1), story.lost_steps, 0.8, fill=False,
                               hatch="//", ec="red",
                               label=f"redone: {story.lost_steps} step"
                                     f"{'' if story.lost_steps == 1 else 's'}"))
    ax.axvline(story.resumed_from, ls="--", color="C2",
               label=f"resumed from checkpoint at step {story.resumed_from}")
    ax.set_xlim(0, story.steps)
    ax.set_ylim(0, 2.2)
    ax.set_yticks([0.5, 1.5], [attempts_label[1], attempts_label[0]])
    ax.set_xlabel("training step")
    ax.set_title(f"{story.label}: a rank dies, the run resumes")
    # beside the bars, never over them
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if has_loss:
        lx = axes[1]
        lx.plot(range(len(story.reference_losses)), story.reference_losses, "-",
                color="grey", lw=4, alpha=0.5, label="uninterrupted run")
        lx.plot(range(len(story.resumed_losses)), story.resumed_losses, "o-", ms=3,
                color="C2", label="interrupted + resumed run")
        lx.axvline(story.resumed_from, ls="--", color="C2")
        lx.set_xlabel("training step")
        lx.set_ylabel("training loss (cross-entropy)")
        lx.legend(fontsize=8)
        lx.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def story_from_runs(*, checkpoint_dir: str, steps: int, resumed_from: int,
                    failed: object = None, fault: object = None,
                    reference_losses: Sequence[float] = (), resumed_losses: Sequence[float] = (),
                    label: str = "labkit run ddp") -> FaultStory:
    """Build the story from the records: the failed attempt, the checkpoint directory on disk
    (checkpoints up to the fault are attempt 1's) and what the resumed run reported.

    ``failed`` is the ``RunFailed`` the first attempt raised: the dead rank comes from it and
    the step it died in from its ``timeline`` (the steps that rank finished). Where there is
    no such error to hand (a torchrun restart), pass the injected ``fault`` spec instead.
    """
    from labkit.base.errors import ConfigError, RunFailed
    from labkit.config.run import FaultSpec
    from labkit.train.checkpoint import complete_steps

    if isinstance(failed, RunFailed) and failed.rank is not None and failed.timeline is not None:
        done = failed.timeline.finished_steps(failed.rank)
        rank, step = failed.rank, max(done, default=-1) + 1
    elif fault is not None:
        spec = FaultSpec.parse(fault) if isinstance(fault, str) else fault
        if not isinstance(spec, FaultSpec):
            raise ConfigError(f"fault {fault!r} must be 'RANK:STEP:KIND' or a FaultSpec")
        rank, step = spec.rank, spec.step
    else:
        raise ConfigError("story_from_runs needs failed=<the RunFailed of the first attempt> "
                          "(with its timeline) or fault='RANK:STEP:KIND'")
    return FaultStory(steps=steps, fault_rank=rank, fault_step=step,
                      checkpoints=[c for c in complete_steps(checkpoint_dir) if c <= step],
                      resumed_from=resumed_from, label=label,
                      reference_losses=list(reference_losses),
                      resumed_losses=list(resumed_losses))


def plot_checkpoint_interval(saves_s: Sequence[float], step_s: float, mtbf_s: float, *,
                             measured: dict[int, float] | None = None) -> Figure:
    """Expected time lost per second of training against the checkpoint interval (Daly's
    2006 model, Young's 1974 first order), for this run's save cost; the band spans the
    model over the fastest and slowest measured save. ``measured`` maps an interval in
    steps to the seconds a real run spent saving per second of training (its points)."""
    import numpy as np

    from labkit.theory.checkpointing import (
        daly_interval,
        waste_fraction,
        young_interval,
        young_waste_fraction,
    )

    delta = float(np.median(saves_s))
    lo, hi = min(saves_s), max(saves_s)
    taus = np.logspace(np.log10(step_s), np.log10(mtbf_s * 3), 200)
    fig = new_figure(figsize=(8.5, 4.2))
    ax = fig.subplots()
    daly = [waste_fraction(t, delta, mtbf_s) for t in taus]
    ax.fill_between(taus, [waste_fraction(t, lo, mtbf_s) for t in taus],
                    [waste_fraction(t, hi, mtbf_s) for t in taus], color="C0", alpha=0.15,
                    label=f"model over the saves' spread ({lo * 1e3:.0f}-{hi * 1e3:.0f} ms)")
    ax.plot(taus, daly, color="C0", lw=2, label=f"Daly's model, save {delta * 1e3:.0f} ms")
    ax.plot(taus, [young_waste_fraction(t, delta, mtbf_s) for t in taus], "--", color="grey",
            label="Young's first order: delta/tau + tau/(2M)")
    for tau, name, color in ((young_interval(delta, mtbf_s), "Young", "C1"),
                             (daly_interval(delta, mtbf_s), "Daly", "C2")):
        ax.axvline(tau, color=color, ls=":", lw=1.5, label=f"{name}'s interval: {tau:.1f} s")
    if measured:
        ks = sorted(measured)
        ax.plot([k * step_s for k in ks], [measured[k] for k in ks], "o", color="C3", ms=8,
                label="measured: time saving / time training")
        for k in ks:
            ax.annotate(f"every {k} steps", (k * step_s, measured[k]), textcoords="offset points",
                        xytext=(8, 4), fontsize=8)
    log_ticks(ax, "x", "seconds")
    log_ticks(ax, "y", "plain")
    ax.set_xlabel("checkpoint interval tau (seconds of training)")
    ax.set_ylabel("time lost per second of training")
    ax.set_title(f"How often to save: a failure every {mtbf_s / 3600:.1f} h (M), "
                 f"this run's save cost (delta)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig
