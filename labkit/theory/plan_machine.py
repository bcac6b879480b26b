"""The planner's step on this machine: the critical path, every rank's CPU, and shared cores.

Teaches why a step of 8 ranks on 2 cores is not a step of 8 GPUs, and what it is instead.
``labkit.theory.plan.predict`` gives the step of a rank that has a core to itself: its
compute, the tensor-parallel all-reduces on its path, the pipeline's bubble and sends, the
data-parallel reduction. On a machine whose ranks share ``C`` cores a step also costs at
least every rank's CPU added up over the cores, and each rank's CPU is more than its
compute: every collective costs CPU (gloo's copies and reduction, the traced call's
bookkeeping), paid on the cores the other ranks need. So, term by term (``predict_here``):

* the critical path (a core each): ``predict``'s terms on a cluster whose wire is the
  all-reduce measured *at the layout's own rank count* (``labkit.theory.plan_comm``: a
  collective waits for its partner to get a core, so 8 ranks' 32 KB all-reduce is slower
  than 2 ranks'), the engine's own one-rank fit (``plan_local.fit_engine``: ZeRO's per-unit
  machinery and a pipeline's per-microbatch work are measured, not assumed), the engine's
  fixed cost per microbatch (``microbatch``), and the data-parallel collectives as the
  lab's engines issue them (``dp``: one per ZeRO unit or DDP bucket, after the backward);
* ``cores``: ``max(0, (compute + fixed + collectives' CPU of every rank) / C - critical
  path)``: the shared-core rule (ranks that share a core run in turn; the work and span
  laws of a schedule on C processors: at least the work over C, at least the critical
  path).

The collectives each rank issues are the caller's (``RankCalls``; ``plan_lab`` counts the
lab's engines'), so that this module knows no implementation. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from labkit.base.errors import ConfigError
from labkit.theory.plan import Prediction, binding, predict
from labkit.theory.plan_comm import COMM_OPS
from labkit.theory.plan_local import StepCost, cluster_of, step_flops
from labkit.theory.plan_models import Decoder, Training
from labkit.theory.plan_terms import Layout, Term

GROUPS = ("tp", "pp", "dp")


@dataclass(frozen=True, kw_only=True)
class Calls:
    """Collectives of one kind that one rank issues in one step."""

    group: str
    """The grid axis they run on: tp, pp or dp."""
    op: str
    """How they are priced (``plan_comm.COMM_OPS``): a send and a receive as one exchange."""
    calls: float
    """How many a step."""
    nbytes: float
    """Their bytes added up, as the trace counts them (a collective's whole tensor)."""
    how: str
    """The count as a formula, for the term."""

    def __post_init__(self) -> None:
        if self.group not in GROUPS or self.op not in COMM_OPS or self.calls < 0 \
                or self.nbytes < 0:
            raise ConfigError(f"Calls({self.group!r}, {self.op!r}, {self.calls}, "
                              f"{self.nbytes}) must name a group of {GROUPS}, an op of "
                              f"{COMM_OPS} and counts >= 0; e.g. Calls(group='tp', "
                              f"op='all_reduce', calls=16, nbytes=524288, how='4 L m')")


@dataclass(frozen=True, kw_only=True)
class RankCalls:
    """The collectives of ``ranks`` alike ranks of a layout (a pipeline's stages differ)."""

    ranks: int
    """How many ranks issue exactly these."""
    calls: tuple[Calls, ...]
    """Their collectives in a step."""


def _wall(cost: StepCost, ranks: int, c: Calls) -> float:
    return cost.comm(c.op, ranks).wall(c.nbytes, c.calls)


def _cpu(cost: StepCost, ranks: int, c: Calls) -> float:
    return cost.comm(c.op, ranks).cpu(c.nbytes, c.calls)


def predict_here(model: Decoder, layout: Layout, training: Training, cost: StepCost,
                 strategy: str, kinds: Sequence[RankCalls]) -> Prediction:
    """The step of ``layout`` run by ``strategy``'s engine on this machine (``cost``),
    its ranks issuing ``kinds``' collectives (see the module docstring)."""
    d, t, p, m = layout.dp, layout.tp, layout.pp, layout.microbatches
    ranks = d * t * p
    if sum(k.ranks for k in kinds) != ranks:
        raise ConfigError(f"kinds cover {sum(k.ranks for k in kinds)} ranks, the layout "
                          f"{ranks} (dp x tp x pp); e.g. one RankCalls(ranks={ranks}, ...)")
    eng = cost.engine(strategy)
    net = cluster_of(cost, ranks, None, strategy)
    base = predict(model, net, training, layout)
    # the critical path: predict's terms but dp, the engine's per-microbatch work, and the
    # dp collectives as issued (no overlap: the lab's engines reduce after the backward)
    dp_wall = max(sum(_wall(cost, ranks, c) for c in k.calls if c.group == "dp") for k in kinds)
    dp_calls = [c for k in kinds for c in k.calls if c.group == "dp"][:2]
    time = [x for x in base.time if x.name != "dp"]
    time.append(Term("microbatch", m * eng.microbatch_s,
                     f"m={m} x {eng.microbatch_s * 1e3:.3g} ms", net.gpu.note))
    time.append(Term("dp", dp_wall, "; ".join(f"{c.how}: {c.calls:g} {c.op} of "
                                              f"{c.nbytes / max(c.calls, 1) / 1e3:.1f} KB"
                                              for c in dp_calls) or "none",
                     f"{ranks}-rank fit of this machine's collectives (plan_comm), each "
                     f"after the backward"))
    critical = sum(x.value for x in time)
    compute_all, fixed_all, comm_all = work_parts(model, layout, cost, strategy, kinds)
    work = compute_all + fixed_all + comm_all
    shared = max(0.0, work / cost.cores - critical) if ranks > cost.cores else 0.0
    time.append(Term("cores", shared,
                     f"max(0, (compute {compute_all * 1e3:.1f} + fixed {fixed_all * 1e3:.1f} + "
                     f"collectives' CPU {comm_all * 1e3:.1f}) ms of {ranks} ranks / "
                     f"{cost.cores} cores - critical path {critical * 1e3:.1f} ms)"
                     if ranks > cost.cores else f"{ranks} ranks on {cost.cores} cores: each "
                     f"has its own",
                     "ranks that share a core run in turn; collectives' CPU: this machine's "
                     "fit at the layout's rank count (plan_comm)"))
    step = critical + shared
    scale = base.step_s / step
    pred = replace(base, time=time, step_s=step, tokens_per_s_per_gpu=base.tokens_per_s_per_gpu
                   * scale, mfu=base.mfu * scale, hfu=base.hfu * scale)
    pred.binding = binding(pred, cluster_of(cost, ranks, cost.cores, strategy))
    return pred


def work_parts(model: Decoder, layout: Layout, cost: StepCost, strategy: str,
               kinds: Sequence[RankCalls]) -> tuple[float, float, float]:
    """Every rank's CPU seconds of a step, added up, in three parts: the FLOPs at the
    engine's rate, the engine's fixed work, and each collective's CPU (at the layout's rank
    count). Over the cores it is the least a step on shared cores can take."""
    d, t, m = layout.dp, layout.tp, layout.microbatches
    ranks = d * t * layout.pp
    eng = cost.engine(strategy)
    compute_all = d * step_flops(model, model.layers, layout.micro_batch * m) / eng.flops_per_s
    fixed_all = (d * m * t * model.layers * eng.layer_s
                 + ranks * (eng.step_s + m * eng.microbatch_s))
    comm_all = sum(k.ranks * sum(_cpu(cost, ranks, c) for c in k.calls) for k in kinds)
    return compute_all, fixed_all, comm_all


def rank_cpu(cost: StepCost, ranks: int, kind: RankCalls) -> float:
    """CPU seconds a step of ``kind``'s collectives costs one of its ranks."""
    return sum(_cpu(cost, ranks, c) for c in kind.calls)
