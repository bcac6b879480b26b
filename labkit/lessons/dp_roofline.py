"""Lesson 01's roofline of data parallelism, measured: compute vs all-reduce per step as the
batch per device grows, the crossover batch on this machine, and on an 8-GPU node from the
datasheets (``labkit.theory.roofline``).

Each rank builds the same MLP and, for every batch size in turn (alternated over the
repeats, ``labkit.lessons.measure``'s protocol), times ``CALLS`` forward + backward passes on
that many samples, then -- after a barrier, so a late peer's compute is not counted as wire
time -- ``CALLS`` all-reduces of all its gradients as a single flat message, and keeps the
least of each. A synchronous step lasts as long as its slowest rank, so each (repeat, batch)
keeps the larger of the ranks' times; a time's statistic is the least repeat (noise only
lengthens a time), its noise the half-spread. The crossover is found per repeat (where
all-reduce / compute crosses 1, interpolated on log scales) and reported over the repeats
with its spread.

Compute is modelled as a **floor plus a time per sample** (``Roofline.floor_fit``): what a
step costs at any batch (every weight read from memory, every op launched) and the work each
sample adds. The FLOP-only formula (``labkit.theory.dp_crossover_batch``) leaves the floor
out, as datasheet roofline models of a GPU node do; on a CPU the floor reads the same memory
the all-reduce copies through, so the two come out alike and the crossover moves to a few
samples or below the smallest batch (measured on a 2-core AVX2 laptop: floor 2.8 ms, the
3.2 MB all-reduce 2.0 ms; docs/benchmarks.md).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.analysis.claims import Claim, Sample, Verdict, judge
from labkit.lessons.machine import load_now, why_not

BATCHES = (4, 32, 256, 1024)
"""Batch per rank, from far below to far above a CPU's crossover (a few dozen samples)."""


CALLS = 5
"""Back-to-back calls timed per (repeat, batch); the least of them is the repeat's time. One
call of gloo's all-reduce on 2 quiet cores ran 0.4 ms at its median and 4 ms at its 90th
percentile (1 MB; docs/benchmarks.md, issue 32): one call a repeat made the ratios' noise
+-40-60 % quiet, and the verdicts flip between runs."""


def _least(calls: int, fn: Any) -> float:
    """The least wall time of ``calls`` calls of ``fn`` (noise only lengthens a time)."""
    best = math.inf
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def roofline_rank(ctx: Any, batches: Sequence[int], rounds: int, width: int,
                  depth: int, calls: int = CALLS) -> dict[str, Any]:
    """Rank side: per round, per batch, the least seconds of ``calls`` forward + backward
    passes and of ``calls`` all-reduces of the gradients (``"compute"`` and
    ``"allreduce"``: rounds x batches), and the model's ``"params"``."""
    import torch

    from labkit.base.events import Op
    from labkit.config.run import ModelConfig
    from labkit.train.models.mlp import build_mlp

    m = ModelConfig(width=width, depth=depth)
    model = build_mlp(m, 0)
    params = [p for p in model.parameters()]
    out: dict[str, Any] = {"compute": [], "allreduce": [],
                           "params": sum(p.numel() for p in params)}
    for round_ in range(rounds):
        comp, comm = [], []
        for b in batches:
            x = torch.randn(b, m.in_dim, generator=torch.Generator().manual_seed(round_))
            y = torch.randint(0, m.out_dim, (b,), generator=torch.Generator().manual_seed(1))

            def forward_backward() -> None:
                model.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()

            ctx.comm.barrier()
            with ctx.span(Op.BACKWARD, step=round_, name=f"batch {b}"):
                comp.append(_least(calls, forward_backward))
            flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
            ctx.comm.barrier()  # a late peer's compute is not wire time
            comm.append(_least(calls, lambda: ctx.comm.all_reduce(flat, step=round_,
                                                                  name=f"batch {b}")))
        out["compute"].append(comp)
        out["allreduce"].append(comm)
    return out


@dataclass
class Roofline:
    """Measured seconds per repeat and batch (the slower rank's), kept repeats only."""

    batches: list[int]
    compute: list[list[float]]
    allreduce: list[list[float]]
    params: int
    world_size: int

    def least(self, kind: str) -> list[float]:
        rows = self.compute if kind == "compute" else self.allreduce
        return [min(r[i] for r in rows) for i in range(len(self.batches))]

    def crossovers(self) -> list[float]:
        """Per repeat: the batch where the all-reduce / compute ratio crosses 1, interpolated
        on log scales between the two measured batches around it; ``nan`` for a repeat whose
        ratio does not cross inside the measured range (its crossover lies outside)."""
        out = []
        for comp, comm in zip(self.compute, self.allreduce):
            ratios = [math.log(a / c) for a, c in zip(comm, comp)]
            found = math.nan
            for i in range(len(ratios) - 1):
                if ratios[i] >= 0 > ratios[i + 1]:
                    lo, hi = math.log(self.batches[i]), math.log(self.batches[i + 1])
                    share = ratios[i] / (ratios[i] - ratios[i + 1])
                    found = math.exp(lo + share * (hi - lo))
                    break
            out.append(found)
        return out

    def crossover(self) -> float:
        """The median crossover over the repeats that crossed inside the range (``nan`` if none
        did): the one number the sentence, the reveal and the figure all read."""
        found = [b for b in self.crossovers() if not math.isnan(b)]
        return statistics.median(found) if found else math.nan

    def floor_fit(self) -> list[tuple[float, float]]:
        """Per repeat: (floor s, s per sample) of the line through its compute at the second
        and third batches (32 and 256: far enough apart for a slope, near enough to the floor
        that the larger batch's noise does not swamp it); empty with fewer than 3 batches."""
        if len(self.batches) < 3:
            return []
        b1, b2 = self.batches[1], self.batches[2]
        out = []
        for comp in self.compute:
            per_sample = (comp[2] - comp[1]) / (b2 - b1)
            out.append((comp[1] - b1 * per_sample, per_sample))
        return out

    def floor_kept(self) -> list[tuple[float, tuple[float, float]]]:
        """(compute at the smallest batch, its line's (floor s, s per sample)) of each repeat
        whose line stays above zero at the smallest batch: a loaded repeat's compute at 32
        and 256 can tip it below. What ``floor_model`` and the floor's verdict both read."""
        b0 = self.batches[0]
        return [(comp[0], (f, s)) for comp, (f, s) in zip(self.compute, self.floor_fit())
                if f + b0 * s > 0]

    def floor_model(self) -> tuple[float, float, float]:
        """(floor s, s per sample, all-reduce s at the smallest batch), each the median over
        the repeats ``floor_kept`` keeps: the three numbers the floor's crossover is made of,
        as the lesson prints them; nans without a fit."""
        fits = [fit for _, fit in self.floor_kept()]
        if not fits:
            return math.nan, math.nan, math.nan
        return (statistics.median(f for f, _ in fits), statistics.median(s for _, s in fits),
                statistics.median(row[0] for row in self.allreduce))

    def floor_crossover(self) -> float:
        """The crossover the floor + slope puts the all-reduce at: (all-reduce - floor) / time
        per sample (``floor_model``); ``nan`` where the floor alone outlasts the all-reduce
        (no batch is communication-bound), or without a fit."""
        floor, per_sample, comm = self.floor_model()
        return (comm - floor) / per_sample if comm > floor and per_sample > 0 else math.nan

    def flops_per_s(self) -> float:
        """This machine's training FLOP/s per rank, from the compute slope (6 x params per
        sample, ``labkit.theory.roofline``) between the smallest and largest batch."""
        comp = self.least("compute")
        slope = (comp[-1] - comp[0]) / (self.batches[-1] - self.batches[0])
        return 6 * self.params / slope if slope > 0 else float("nan")


    def formula_crossover(self, bandwidth_Bps: float, bytes_per_param: float = 4.0) -> float:
        """``labkit.theory.dp_crossover_batch`` with this machine's FLOP/s (``flops_per_s``)
        and a measured bandwidth; ``nan`` when compute did not grow with the batch."""
        from labkit.theory.roofline import dp_crossover_batch

        flops = self.flops_per_s()
        if not math.isfinite(flops):
            return math.nan
        return dp_crossover_batch(self.world_size, flops, bandwidth_Bps, bytes_per_param)


def roofline_sweep(pool: Any, batches: Sequence[int] = BATCHES, repeats: int = 4,
                   width: int = 512, depth: int = 4, warmup: int = 1,
                   calls: int = CALLS) -> Roofline:
    """Every batch size, alternated ``warmup + repeats`` times on ``pool``'s ranks."""
    res = pool.launch(roofline_rank, list(batches), warmup + repeats, width, depth, calls)
    per_rank = res.results
    keep = slice(warmup, None)
    slowest = {k: [[max(r[k][i][j] for r in per_rank) for j in range(len(batches))]
                   for i in range(warmup + repeats)][keep] for k in ("compute", "allreduce")}
    return Roofline(list(batches), slowest["compute"], slowest["allreduce"],
                    int(per_rank[0]["params"]), len(per_rank))


def _side(r: Roofline, i: int) -> Sample:
    """All-reduce / compute at batch ``i``: the alternated repeats' ratios."""
    return Sample.ratio([row[i] for row in r.allreduce], [row[i] for row in r.compute])


def roofline_verdicts(r: Roofline) -> list[Verdict]:
    """The model judged at both ends of the sweep and in between: compute at the smallest
    batch is the floor plus its samples' work, as the line through the next two batches puts
    it (within 1.5x); compute outlasts the all-reduce at the largest batch; the all-reduce's
    time does not grow with the batch (within 2x). Ratios of the alternated repeats."""
    lo, hi = 0, len(r.batches) - 1
    out = []
    fits = r.floor_fit()
    if fits:
        kept = [(m, floor + r.batches[lo] * per_sample)
                for m, (floor, per_sample) in r.floor_kept()]
        claim = Claim.within_factor(1.0, 1.5, "compute is a floor plus the samples' work (the "
                                    f"line through batches {r.batches[1]} and {r.batches[2]})")
        what = f"compute at batch {r.batches[lo]} / the line's"
        ratio = (Sample.ratio([m for m, _ in kept], [p for _, p in kept]) if kept
                 else Sample(math.nan, math.nan))
        out.append(judge(ratio, claim, what, fmt=".2f", premise="" if len(kept) == len(fits)
                         else (f"{len(fits) - len(kept)} of {len(fits)} repeats' lines fell "
                               f"below zero at batch {r.batches[lo]}: their compute at the "
                               "larger batches waited for a core")))
    out.append(judge(_side(r, hi), Claim.below(1.0, "above the crossover compute takes longer than "
                                             "the all-reduce"),
                     f"all-reduce / compute at batch {r.batches[hi]}", fmt=".2f"))
    out.append(judge(Sample.ratio([row[hi] for row in r.allreduce], [row[lo] for row in r.allreduce]),
                     Claim.within_factor(1.0, 2.0, "the all-reduce does not grow with the batch"),
                     f"all-reduce at batch {r.batches[hi]} / at batch {r.batches[lo]}", fmt=".2f"))
    return out


def _bound(r: Roofline, i: int) -> str:
    """Which of the two bounds batch ``i``, beyond the repeats' noise (none measured with
    one repeat); else "even within the noise"."""
    side = _side(r, i)
    noise = 0.0 if math.isnan(side.noise) else side.noise
    return ("communication-bound" if side.value - noise > 1 else
            "compute-bound" if side.value + noise < 1 else "even within the noise")


def smallest_batch_text(r: Roofline) -> str:
    """Which side of the crossover the smallest batch fell on, with its noise, and why: the
    compute's floor against the all-reduce (a measurement reported, not a rule judged: where
    the crossover lies is the machine's, which is the section's point)."""
    b, side = r.batches[0], _side(r, 0)
    band = f"all-reduce / compute {side.value:.2f} " + (
        "(one repeat)" if math.isnan(side.noise) else f"+- {side.noise:.2f}")
    head = {"communication-bound": f"at batch {b} the all-reduce outlasts compute ({band}): "
                                   "communication-bound",
            "compute-bound": f"at batch {b} compute outlasts the all-reduce ({band}): "
                             "compute-bound already",
            }.get(_bound(r, 0), f"at batch {b} the two take the same time within the noise "
                                f"({band})")
    floor, per_sample, comm = r.floor_model()
    if math.isnan(floor):
        return head
    cross = r.floor_crossover()
    why = (f"the floor puts the crossover at about {cross:.0f} samples per rank"
           if math.isfinite(cross) else
           "the floor alone outlasts the all-reduce: no batch is communication-bound here")
    return (f"{head}\n  compute = floor {floor * 1e3:.2f} ms (at any batch: every weight read, "
            f"every op launched) + {per_sample * 1e3:.3f} ms a sample (the line through batches "
            f"{r.batches[1]} and {r.batches[2]}); the all-reduce {comm * 1e3:.2f} ms -> {why}")


def roofline_text(r: Roofline) -> str:
    """The measured split per batch, the rule judged at both ends, the crossover with its
    noise, and the formula's crossover from this machine's FLOP/s and fitted bandwidth."""
    comp, comm = r.least("compute"), r.least("allreduce")
    lines = [f"batch {b:5d} per rank: compute {c * 1e3:7.2f} ms, all-reduce of "
             f"{4 * r.params / 1e6:.2f} MB {a * 1e3:6.2f} ms -> {_bound(r, i)}"
             f"  (least of {len(r.compute)} repeats x {CALLS} calls)"
             for i, (b, c, a) in enumerate(zip(r.batches, comp, comm))]
    verdicts = roofline_verdicts(r)
    lines += [v.sentence() for v in verdicts]
    lines.append(smallest_batch_text(r))
    if not all(v.holds for v in verdicts):
        lines.append("  no dedicated-core replay of this sweep: its ranks time each forward + "
                     "backward and each all-reduce with a clock, not a trace of spans; "
                     + why_not(load_now(), r.world_size))
    found = [b for b in r.crossovers() if not math.isnan(b)]
    if found:
        cross = Sample.of(found, "median")
        noise = f"+- {cross.noise:.0f}" if len(found) > 1 else "one repeat: noise not measured"
        lines.append(f"crossover on this machine: about {r.crossover():.0f} samples per rank "
                     f"({noise}; {len(found)} of {len(r.compute)} repeats crossed between "
                     f"batch {r.batches[0]} and {r.batches[-1]})")
    else:
        lines.append(f"crossover on this machine: no repeat crossed between batch "
                     f"{r.batches[0]} and {r.batches[-1]} -- it lies outside the measured range")
    return "\n".join(lines)


def node_text(params: float, batches: Sequence[float] = (256, 1024, 4096),
              gpus: Mapping[str, str] | None = None) -> str:
    """From the datasheets: the crossover on 8-GPU nodes, and a named model's step split."""
    from labkit.theory.roofline import ACCELERATORS, dp_roofline, node_crossover

    lines = []
    for gpu in gpus or {g: g for g in ACCELERATORS}:
        rows = dp_roofline(params, gpu, batches)
        split = "; ".join(f"{row['batch_per_device']:.0f} tokens: compute "
                          f"{float(row['compute_s']) * 1e3:.1f} ms vs all-reduce "
                          f"{float(row['allreduce_s']) * 1e3:.1f} ms ({row['bound']}-bound)"
                          for row in rows)
        lines.append(f"8 x {gpu} ({ACCELERATORS[gpu].note}): crossover "
                     f"{node_crossover(gpu):.0f} tokens per GPU with bf16 gradients\n  "
                     f"a {params / 1e9:g}B-parameter model: {split}")
    return "\n".join(lines)
