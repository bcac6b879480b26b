"""Pipeline parallelism on paper: the bubble, activation memory, and the slowest stage.

Teaches: a pipeline of p stages fed m microbatches idles while it fills and drains (the
"bubble"); more microbatches shrink the bubble's share (GPipe, Huang et al. 2019); 1F1B
has the same bubble as GPipe but holds far fewer microbatches' activations (PipeDream-
Flush, Narayanan et al. 2021); interleaving v model chunks per rank divides the bubble by v
(Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM"). Splitting the backward into its input-gradient part (B) and its
weight-gradient part (W), which nobody downstream waits for, lets ZB-H1 fill the cooldown
with Ws at 1F1B's memory: its bubble is ``(p-1)(T_F + T_B - T_W)`` instead of 1F1B's
``(p-1)(T_F + T_B + T_W)``, a third of it when the three cost the same (Qi et al. 2023,
"Zero Bubble Pipeline Parallelism", section 2.1, ICLR 2024). And a pipeline runs only as
fast as its slowest stage: the seed's team went from about 1.2x to 3.4x on four GPUs by
balancing stages and adding microbatches.

Conventions: the bubble is reported either as a share of the total step time,
``(p-1)/(m+p-1)``, or relative to the ideal (bubble-free) compute time, ``(p-1)/m``;
every function says which. Forward and backward of one microbatch on one stage are lumped
into one time slot, as in the papers' analysis.
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.base.errors import ConfigError
from labkit.schedules.plans import CLOSED_FORM
from labkit.theory.batch import check_choice, check_int, check_number

SCHEDULES = (*CLOSED_FORM, "zb")
"""The schedules with a closed-form bubble: those ``labkit.schedules`` names (GPipe, 1F1B,
interleaved) and zero bubble ZB-H1, whose closed form (Qi et al. 2023) is here."""
RELATIVE_TO = ("total", "ideal")


def _check_pipeline(stages: int, microbatches: int, schedule: str, virtual: int) -> None:
    check_int("stages", stages, 1, "stages=4")
    check_int("microbatches", microbatches, 1, "microbatches=8")
    check_choice("schedule", schedule, SCHEDULES, "schedule='1f1b'")
    check_int("virtual", virtual, 1, "virtual=2")
    if virtual != 1 and schedule != "interleaved":
        raise ConfigError(
            f"virtual ({virtual}) must be 1 unless schedule is 'interleaved' (got schedule="
            f"{schedule!r}); e.g. schedule='interleaved', virtual={virtual}")


def _zb_costs(costs: Sequence[float]) -> tuple[float, float, float]:
    example = "costs=(1.0, 1.0, 1.0)"
    if not isinstance(costs, (list, tuple)) or len(costs) != 3:
        raise ConfigError(f"costs ({costs!r}) must be three times (T_F, T_B, T_W): forward, "
                          f"input-gradient backward, weight-gradient backward; e.g. {example}")
    f, b, w = (check_number(f"costs[{i}]", c, example) for i, c in enumerate(costs))
    if min(f, b, w) <= 0:
        raise ConfigError(f"costs ({costs!r}) must all be > 0; e.g. {example}")
    if w > f + b:
        raise ConfigError(f"costs ({costs!r}): ZB-H1's closed form needs T_W <= T_F + T_B "
                          f"(here {w:g} > {f + b:g}); e.g. {example}")
    return f, b, w


def bubble_fraction(stages: int, microbatches: int, schedule: str = "gpipe",
                    virtual: int = 1, relative_to: str = "total",
                    costs: Sequence[float] = (1.0, 1.0, 1.0)) -> float:
    """Idle share of a pipeline step with p = ``stages`` and m = ``microbatches``.

    ``relative_to="total"``: bubble time / total step time, ``(p-1)/(m+p-1)`` for GPipe and
    1F1B (e.g. p=4, m=8 -> 3/11 = 0.27). ``relative_to="ideal"``: bubble time / ideal
    compute time, ``(p-1)/m`` (the form used by Narayanan et al.). ``"interleaved"`` with v
    = ``virtual`` chunks per rank: ``(p-1)/(v*m+p-1)`` of total, ``(p-1)/(v*m)`` of ideal.
    (Megatron's interleaved schedule also wants m to be a multiple of p; the formula does
    not need it, so it is not enforced here.)

    ``"zb"`` (ZB-H1, Qi et al. 2023, section 2.1) with ``costs`` = (T_F, T_B, T_W), the times
    of a forward, an input-gradient backward and a weight-gradient backward: each rank idles
    ``(p-1)(T_F + T_B - T_W)`` while it works ``m(T_F + T_B + T_W)``. With equal costs (the
    paper's assumption, and ``labkit.schedules``' split of B = 2 into I = W = 1) that is
    ``(p-1)/(3m+p-1)`` of total and ``(p-1)/(3m)`` of ideal: a third of 1F1B's bubble
    relative to ideal (p=4, m=8 -> 1/8 of ideal, 3/27 of total). The form needs m >= p.
    """
    _check_pipeline(stages, microbatches, schedule, virtual)
    check_choice("relative_to", relative_to, RELATIVE_TO, "relative_to='total'")
    if schedule == "zb":
        f, b, w = _zb_costs(costs)
        if microbatches < stages:
            raise ConfigError(
                f"microbatches ({microbatches}) must be >= stages ({stages}) for ZB-H1's "
                f"closed form: with fewer, too few Ws are left to fill the cooldown "
                f"(labkit.schedules.planned_bubble_fraction simulates any plan); e.g. "
                f"microbatches={stages}")
        idle_time = (stages - 1) * (f + b - w)
        work = microbatches * (f + b + w)
        return idle_time / work if relative_to == "ideal" else idle_time / (work + idle_time)
    slots = virtual * microbatches  # useful slots per rank, in units of one chunk's work
    idle = stages - 1
    if relative_to == "ideal":
        return idle / slots
    return idle / (slots + idle)


def ideal_pipeline_speedup(stages: int, microbatches: int, schedule: str = "gpipe",
                           virtual: int = 1) -> float:
    """Speedup of perfectly balanced stages over one device: ``p * (1 - bubble_total)``.

    GPipe/1F1B: ``p*m/(m+p-1)``; p=4 stages with m=16 microbatches give 3.37x, close to
    the seed's measured 3.4x. Communication between stages is not counted.
    """
    return stages * (1.0 - bubble_fraction(stages, microbatches, schedule, virtual, "total"))


def pipeline_peak_activations(stages: int, microbatches: int, schedule: str,
                              stage: int = 0) -> int:
    """How many microbatches' activations stage ``stage`` (0-based) holds at its peak.

    GPipe runs all m forwards before any backward, so every stage holds m. 1F1B lets
    stage s run only ``p - s`` forwards ahead of its first backward, so it holds
    ``min(p - stage, m)``: stage 0 holds p, the last stage 1. This is why 1F1B needs less
    memory than GPipe at the same bubble. Interleaved schedules are not covered (their
    count depends on the implementation's warmup rule). ZB-H1 (``"zb"``) holds
    ``min(p, m)`` on *every* stage: a stage input is freed only by its W, which is delayed
    so that each stage keeps as many microbatches in flight as stage 0 of 1F1B -- the peak
    of 1F1B, reached by every rank (Qi et al. 2023, section 2.1).
    """
    _check_pipeline(stages, microbatches, schedule, 1)
    if schedule == "interleaved":
        raise ConfigError(
            f"schedule ({schedule!r}) is not supported by pipeline_peak_activations; "
            "use 'gpipe' or '1f1b'; e.g. schedule='1f1b'")
    check_int("stage", stage, 0, "stage=0")
    if stage >= stages:
        raise ConfigError(
            f"stage ({stage}) must be < stages ({stages}) (stages are numbered from 0); "
            f"e.g. stage={stages - 1}")
    if schedule == "gpipe":
        return microbatches
    if schedule == "zb":
        return min(stages, microbatches)
    return min(stages - stage, microbatches)


def _check_costs(stage_costs: Sequence[float]) -> list[float]:
    if not isinstance(stage_costs, (list, tuple)) or not stage_costs:
        raise ConfigError(
            f"stage_costs ({stage_costs!r}) must be a non-empty list of per-stage times; "
            "e.g. stage_costs=[1.0, 1.0, 2.0, 1.0]")
    costs = [check_number(f"stage_costs[{i}]", c, "stage_costs=[1.0, 1.0, 2.0, 1.0]")
             for i, c in enumerate(stage_costs)]
    if max(costs) <= 0:
        raise ConfigError(
            f"stage_costs ({stage_costs!r}) must contain at least one positive time; "
            "e.g. stage_costs=[1.0, 1.0, 2.0, 1.0]")
    return costs


def stage_balance_speedup(stage_costs: Sequence[float]) -> float:
    """Best-case pipeline speedup over one device, capped by the slowest stage: sum / max.

    ``stage_costs`` are the times one microbatch spends on each stage (any unit). With
    infinitely many microbatches a new microbatch leaves the pipe every ``max`` units, while
    one device would need ``sum``. Four equal stages give 4x; ``[1, 1, 1, 5]`` only 1.6x.
    """
    costs = _check_costs(stage_costs)
    return sum(costs) / max(costs)


def pipeline_speedup(stage_costs: Sequence[float], microbatches: int) -> float:
    """Speedup over one device for ``microbatches`` microbatches through uneven stages.

    One device needs ``m * sum(c)``. The pipeline needs ``sum(c)`` for the first
    microbatch to cross every stage, then one more ``max(c)`` per remaining microbatch:
    ``m * sum(c) / (sum(c) + (m-1) * max(c))``. Balanced stages give ``p*m/(m+p-1)``,
    the GPipe bubble; as m grows this tends to ``stage_balance_speedup``.
    """
    costs = _check_costs(stage_costs)
    m = check_int("microbatches", microbatches, 1, "microbatches=8")
    total = sum(costs)
    return m * total / (total + (m - 1) * max(costs))


def uneven_bubble_fraction(stage_costs: Sequence[float], microbatches: int) -> float:
    """Idle share of a GPipe or 1F1B step whose stages cost ``stage_costs`` a microbatch
    (forward + backward, any unit): ``1 - pipeline_speedup(stage_costs, m) / p``, i.e.
    ``1 - m*sum(c) / (p*(sum(c) + (m-1)*max(c)))``: the slowest stage paces the pipeline.
    Equal stages give ``(p-1)/(m+p-1)`` (``bubble_fraction``); a last stage 1.1x the first
    gives 0.222 at p = 2, m = 4 where equal ones give 0.200.
    """
    return 1.0 - pipeline_speedup(stage_costs, microbatches) / len(stage_costs)
