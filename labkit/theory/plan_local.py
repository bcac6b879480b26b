""""This machine" as the planner's cluster: a measured step cost, shared cores, a fitted wire.

Teaches that the planner's cluster is only numbers, and that a laptop's can be measured
instead of read off a datasheet: the same ``labkit.theory.plan.predict`` that rates Llama 3
405B on 16,384 H100s rates the lab's own GPT on the student's cores (issue 38, item 4).

* **Compute** (``fit_step_cost``): a GPU spends its step in large matmuls, so a FLOP rate
  predicts it; a CPU running a 4-layer, 64-wide GPT spends most of it in per-op work
  (autograd, dispatch, small elementwise ops, the optimizer's per-tensor loop), which no
  FLOP rate sees. So the step of one rank on one core is measured at a few model sizes
  (depth and batch varied, ``labkit.lessons.plan_local``), by each engine the lab's layouts
  use (torch DDP, the ZeRO transform, hybrid, the pipeline: their per-op machinery differs),
  and fitted per engine (``fit_engine``), by least squares, to

      t = step_s + m (microbatch_s + layer_s x L) + F / rate

  with L the layers, F the planner's own FLOP count of the step (``step_flops``: the same
  ``6 N + 12 s h`` per token and layer, plus the logits, that ``predict`` uses). Depth moves
  L and F together, batch moves only F, so the fixed and the proportional parts separate by
  the fit, not by a constant. The CPU seconds of the step are fitted (what the step costs a
  core, not what it waited for one on a busy machine). ``predict`` then charges ``layer_s``
  per layer per microbatch on each rank (not split by tp: a tensor-parallel rank runs every
  op of its layers, on halves), ``step_s`` once per step, and the rest at ``rate``.
* **Cores** and the collectives' CPU: ``labkit.theory.plan_machine`` (the shared-core rule)
  and ``labkit.theory.plan_comm`` (each collective's wall and CPU at 2, 4 and 8 ranks).
* **Wire**: the pair all-reduce measured at the layout's own rank count (``cluster_of``,
  ``plan_comm.wire_of``): latency per message and bandwidth as measured, so the planner's
  ``LINK_EFFICIENCY`` (a datasheet's discount) is undone here.
* **Memory**: the machine's RAM shared by its ranks.

The measurement is cached like ``labkit calibrate``'s (``$LABKIT_CACHE/step_cost.json``, one
entry per host, Python, torch, labkit checkout and core count; ``labkit.base.cache``).
``gemm_rate`` is the first attempt, kept for the comparison in ``bench/bench_plan_local.py``:
calibrate's matmul rate at the step's GEMM shapes alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from labkit.base import places
from labkit.base.cache import KeyedCache
from labkit.base.errors import ConfigError
from labkit.theory.interconnect import Interconnect
from labkit.theory.plan import COMPUTE_EFFICIENCY
from labkit.theory.plan_comm import COMM_OPS, CommCost, wire_of
from labkit.theory.plan_models import GPU, Cluster, Decoder
from labkit.theory.plan_terms import LINK_EFFICIENCY

Shape = tuple[int, int, int]
CACHE_FILE = "step_cost.json"


def gemm_rate(rates: Mapping[str, float], shapes: list[Shape]) -> float:
    """FLOP/s of a step's matmuls: ``sum(2 m k n) / sum(2 m k n / rate(shape))`` over
    ``shapes``, each rate read from calibrate's ``"mxkxn"`` keys."""
    missing = [s for s in shapes if f"{s[0]}x{s[1]}x{s[2]}" not in rates]
    if not shapes or missing:
        raise ConfigError(f"the calibration holds no rate for the shapes {missing or shapes}; "
                          f"run `labkit calibrate` (it measures a run's shapes), e.g. "
                          f"shapes=[(512, 64, 192)]")
    flops = [2.0 * m * k * n for m, k, n in shapes]
    seconds = sum(f / rates[f"{m}x{k}x{n}"] for f, (m, k, n) in zip(flops, shapes, strict=True))
    return sum(flops) / seconds


def measured_cluster(*, rate_flops_per_s: float, alpha_s: float, bandwidth_Bps: float,
                     ranks: int, memory_bytes: float, layer_s: float = 0.0, step_s: float = 0.0,
                     cores: int | None = None, note: str = "") -> Cluster:
    """``ranks`` processes of one machine as a one-node cluster: each computes at
    ``rate_flops_per_s`` plus ``layer_s`` / ``step_s`` of fixed work, ``cores`` shared by
    all (None: a core each), all talking over one fitted wire."""
    for name, value in (("rate_flops_per_s", rate_flops_per_s), ("bandwidth_Bps", bandwidth_Bps),
                        ("memory_bytes", memory_bytes)):
        if not value > 0:
            raise ConfigError(f"{name} ({value!r}) must be > 0; e.g. {name}=1e9")
    for name, value in (("alpha_s", alpha_s), ("layer_s", layer_s), ("step_s", step_s)):
        if value < 0:
            raise ConfigError(f"{name} ({value!r}) must be >= 0 seconds; e.g. {name}=5e-5")
    wire = Interconnect("this machine", alpha_s, bandwidth_Bps / LINK_EFFICIENCY, "intra-node",
                        "alpha-beta fitted to this machine's all-reduce (bandwidth as measured)")
    # the rate is what the step's FLOPs run at: peak x MAMF (1) x COMPUTE_EFFICIENCY = rate
    peak = rate_flops_per_s / COMPUTE_EFFICIENCY
    device = GPU("this machine", peak, peak, memory_bytes / ranks, wire, 1.0,
                 note or "measured on this machine, per rank", layer_s=layer_s, step_s=step_s)
    return Cluster(device, ranks, ranks, wire, wire, cores=cores)


# --- the step's cost, fitted ----------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CostSample:
    """One one-rank, one-core run of the lab's GPT: its size and its measured step."""

    layers: int
    """Transformer layers of the run's model."""
    batch: int
    """Sequences in its step (all its microbatches)."""
    seconds: float
    """Median CPU seconds of its steps (the first skipped)."""
    strategy: str = "ddp"
    """The ``labkit run`` strategy whose engine ran it (one rank: no communication)."""
    microbatches: int = 1
    """Microbatches its step was cut into (the engines that take them: hybrid, pipeline)."""


@dataclass(frozen=True, kw_only=True)
class EngineCost:
    """One engine's one-rank step, fitted: ``t = step_s + m (microbatch_s + layer_s L) +
    F / flops_per_s`` (m microbatches, L layers, F the step's FLOPs)."""

    strategy: str
    """The ``labkit run`` strategy (ddp, zero, hybrid, pipeline)."""
    step_s: float
    """Fixed seconds per step (optimizer, bookkeeping)."""
    microbatch_s: float
    """Fixed seconds per microbatch (embedding, head, loss, the schedule's per-microbatch
    work); 0 for an engine measured at one microbatch only (then in ``step_s``)."""
    layer_s: float
    """Fixed seconds per layer per microbatch (forward and backward), whatever its size."""
    flops_per_s: float
    """The rate of the FLOP-proportional rest, on one core."""
    worst_residual: float = 0.0
    """The largest |fit - measured| / measured over its samples."""


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """This machine's step, fitted: ``t = step_s + layer_s x L + F / flops_per_s``."""

    layer_s: float
    """Fixed seconds per layer per microbatch (forward and backward), whatever its size."""
    step_s: float
    """Fixed seconds per step per rank (embedding, head, loss, optimizer, bookkeeping)."""
    flops_per_s: float
    """The rate of the FLOP-proportional rest, on one core."""
    cores: int
    """Cores of this machine the ranks share."""
    alpha_s: float
    """Latency of one message of the fitted all-reduce, seconds."""
    bandwidth_Bps: float
    """Bandwidth of the fitted all-reduce, bytes per second."""
    memory_bytes: float
    """The machine's RAM."""
    samples: tuple[CostSample, ...] = ()
    """The runs it was fitted to."""
    worst_residual: float = 0.0
    """The largest |fit - measured| / measured over the samples."""
    load: str = ""
    """The load average while it was measured (the caller's words)."""
    comms: tuple[CommCost, ...] = ()
    """Each op of ``COMM_OPS`` at each measured rank count (``fit_comm``)."""
    engines: tuple[EngineCost, ...] = ()
    """Each engine's own fit (``fit_engine``); the fields above are DDP's."""

    def engine(self, strategy: str) -> EngineCost:
        """``strategy``'s fit; DDP's (the fields above) where it was not measured."""
        for e in self.engines:
            if e.strategy == strategy:
                return e
        return EngineCost(strategy="ddp", step_s=self.step_s, microbatch_s=0.0,
                          layer_s=self.layer_s, flops_per_s=self.flops_per_s,
                          worst_residual=self.worst_residual)

    def comm(self, op: str, ranks: int) -> CommCost:
        """The fit of ``op`` at ``ranks``; else at the nearest measured rank count above
        (more ranks on the same cores wait longer), else the nearest below."""
        mine = sorted((c for c in self.comms if c.op == op), key=lambda c: c.ranks)
        if not mine:
            raise ConfigError(f"this machine's step cost holds no {op!r} measurement; measure "
                              f"again: `python -m labkit.lessons.plan_local --refresh`")
        above = [c for c in mine if c.ranks >= ranks]
        return above[0] if above else mine[-1]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepCost:
        fields = dict(data)
        fields["samples"] = tuple(CostSample(**s) for s in fields.get("samples", ()))
        fields["comms"] = tuple(CommCost(**c) for c in fields.get("comms", ()))
        fields["engines"] = tuple(EngineCost(**e) for e in fields.get("engines", ()))
        return cls(**fields)


def step_flops(model: Decoder, layers: int, batch: int) -> float:
    """The planner's FLOPs of one step of ``model`` cut to ``layers`` layers, ``batch``
    sequences: ``(L (6 N_layer + 12 s h) + 6 V h) s b`` (``predict``'s count)."""
    s, h = model.seq, model.hidden
    return (layers * (6 * model.layer_matmul_params + 12 * s * h) + 6 * model.vocab * h) * s * batch


def _solve(rows: list[list[float]], ys: list[float], keep: list[int]) -> list[float]:
    """Least squares over the columns ``keep`` (the others 0): the normal equations,
    by Gaussian elimination."""
    n = len(keep)
    a = [[sum(r[i] * r[j] for r in rows) for j in keep] + [sum(r[i] * y for r, y in
                                                              zip(rows, ys, strict=True))]
         for i in keep]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(a[r][c]))
        a[c], a[pivot] = a[pivot], a[c]
        if abs(a[c][c]) < 1e-300:
            raise ConfigError("the step-cost samples cannot separate the fixed and the "
                              "proportional parts; measure at least two depths and two "
                              "batches, e.g. (2, 8), (4, 8), (4, 16)")
        for r in range(n):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=True)]
    out = [0.0] * len(rows[0])
    for c, i in enumerate(keep):
        out[i] = a[c][n] / a[c][c]
    return out


def fit_engine(samples: Sequence[CostSample], model: Decoder) -> EngineCost:
    """Least squares of ``t = step_s + m microbatch_s + m L layer_s + F / rate`` over one
    engine's ``samples`` (relative errors weighted alike: each row divided by its t), none of
    the four below 0; ``microbatch_s`` only where the samples vary m."""
    sizes = {(s.layers, s.batch, s.microbatches) for s in samples}
    kinds = {s.strategy for s in samples}
    if len(kinds) != 1 or len(sizes) < 3 or any(s.seconds <= 0 for s in samples):
        raise ConfigError(f"a step-cost fit needs three or more sizes of one strategy with "
                          f"seconds > 0 (got {sorted(kinds)}, "
                          f"{[(s.layers, s.batch, s.seconds) for s in samples]}); e.g. "
                          f"layers, batch = (2, 8), (4, 8), (4, 16)")
    rows = [[1.0 / s.seconds, s.microbatches / s.seconds, s.microbatches * s.layers / s.seconds,
             step_flops(model, s.layers, s.batch) / s.seconds] for s in samples]
    ones = [1.0] * len(samples)
    keep = [0, 1, 2, 3] if len({s.microbatches for s in samples}) > 1 else [0, 2, 3]
    coef = _solve(rows, ones, keep)
    while any(coef[i] < 0 for i in keep) and len(keep) > 1:  # drop what noise made negative
        keep.remove(min(keep, key=lambda i: coef[i]))
        coef = _solve(rows, ones, keep)
    if coef[3] <= 0:
        raise ConfigError("the step-cost fit found no FLOP-proportional part (its rate came out "
                          "<= 0): the samples were too noisy; measure again on a quiet machine")
    fitted = [sum(c * x for c, x in zip(coef, r, strict=True)) for r in rows]
    return EngineCost(strategy=kinds.pop(), step_s=coef[0], microbatch_s=coef[1],
                      layer_s=coef[2], flops_per_s=1.0 / coef[3],
                      worst_residual=max(abs(f - 1.0) for f in fitted))


def fit_step_cost(samples: Sequence[CostSample], model: Decoder, *, cores: int, alpha_s: float,
                  bandwidth_Bps: float, memory_bytes: float, load: str = "") -> StepCost:
    """``fit_engine`` of each strategy in ``samples``; DDP's (which must be there) also as
    the cost's own fields."""
    by: dict[str, list[CostSample]] = {}
    for sample in samples:
        by.setdefault(sample.strategy, []).append(sample)
    engines = tuple(fit_engine(group, model) for group in by.values())
    ddp = next((e for e in engines if e.strategy == "ddp"), None)
    if ddp is None:
        raise ConfigError(f"the step cost needs DDP's samples (got {sorted(by)}); e.g. "
                          f"CostSample(layers=4, batch=8, seconds=0.01)")
    return StepCost(layer_s=ddp.layer_s, step_s=ddp.step_s, flops_per_s=ddp.flops_per_s,
                    cores=cores, alpha_s=alpha_s, bandwidth_Bps=bandwidth_Bps,
                    memory_bytes=memory_bytes, samples=tuple(samples),
                    worst_residual=ddp.worst_residual, load=load, engines=engines)


def cluster_of(cost: StepCost, ranks: int, cores: int | None = None,
               strategy: str = "ddp") -> Cluster:
    """``ranks`` ranks on this machine, as ``predict`` takes a cluster: ``strategy``'s
    engine fit (``StepCost.engine``); the wire is the all-reduce measured with ``ranks``
    ranks on the machine (``StepCost.comm``) where there are collectives; ``cores`` shared
    (None: a core each)."""
    eng = cost.engine(strategy)
    note = (f"{eng.strategy}'s engine, fitted on this machine: t = {eng.step_s * 1e3:.3g} ms + "
            f"m x ({eng.microbatch_s * 1e3:.3g} ms + {eng.layer_s * 1e3:.3g} ms x L) + F / "
            f"{eng.flops_per_s / 1e9:.3g} GFLOP/s (one rank, one core)")
    alpha, bandwidth = cost.alpha_s, cost.bandwidth_Bps
    if cost.comms:
        alpha, bandwidth = wire_of(cost.comm("all_reduce", ranks))
    return measured_cluster(rate_flops_per_s=eng.flops_per_s, alpha_s=alpha,
                            bandwidth_Bps=bandwidth, ranks=ranks,
                            memory_bytes=cost.memory_bytes, layer_s=eng.layer_s,
                            step_s=eng.step_s, cores=cores, note=note)


# --- the cache ------------------------------------------------------------------------------

CACHE = KeyedCache("step_cost", label="step-cost", what="this machine's step cost")
"""``$LABKIT_CACHE/step_cost.json``, one entry per ``cache_key`` (``labkit.base.cache``, as
calibrate's peak)."""


def cache_path() -> Path:
    """``$LABKIT_CACHE/step_cost.json`` (``labkit.base.places``, as calibrate's)."""
    return CACHE.path


COST_VERSION = 2
"""What a cached cost was measured with: 2 since one-rank samples stopped paying for
collectives over a group of one rank (``labkit.rank.subgroups``); an entry of another
version is measured again."""


def cache_key(cores: int) -> str:
    """One entry per machine (``labkit.base.places.machine_key``, as calibrate's), core
    count and ``COST_VERSION``."""
    return f"{places.machine_key()}|{cores} cores|v{COST_VERSION}"


def load_cost(cores: int) -> StepCost | None:
    """The cached step cost of this machine with ``cores`` cores, or None (none kept, or one
    of an older shape)."""
    entry = CACHE.get(cache_key(cores))
    try:
        cost = StepCost.from_json(entry) if entry else None
    except (TypeError, ValueError):
        return None
    if cost is None or {c.op for c in cost.comms} != set(COMM_OPS):
        return None  # older: no collectives, or not every op this version prices
    return cost


def store_cost(cost: StepCost) -> None:
    """Keep ``cost`` (best effort: an unwritable cache costs a measurement next time). The
    caller holds ``CACHE.locked()``."""
    CACHE.put(cache_key(cost.cores), cost.to_json())
