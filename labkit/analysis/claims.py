"""Verdicts on timed claims, computed from the numbers: holds, contradicted or inconclusive.

A lesson states a rule ("bucketing overlaps the all-reduce with backward, so the step is
shorter", "the bubble is (p-1)/(m+p-1)"). Its run measures the effect a few times. Whether
the run *shows* the rule is arithmetic, never prose written in advance:

* the claim is an interval of acceptable values: a direction ("shorter": the ratio naive /
  bucketed above 1), or an agreement with a prediction ("within 0.05 of 0.200", "within 1.5x
  of 5.0 ms");
* the measurement is a value with its noise, from repeats (``Sample``): the statistic the
  claim needs (the least of the repeats for a time or a bubble, which noise only lengthens;
  the median for a ratio of alternated pairs) and the half-spread of the repeats;
* ``judge`` says **holds** when the whole noise band lies inside the claim, **contradicted**
  when it lies wholly outside, and **inconclusive on this machine (noise +-x %)** when the
  band straddles the claim's edge. It never says "holds" for an effect inside its noise or
  of the wrong sign.

Every sentence a lesson prints about a timed outcome is ``Verdict.sentence()``, with the
numbers it judged. Pure: no torch, no processes (``labkit.lessons.measure`` runs the
repeats).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

HOLDS, CONTRADICTED, INCONCLUSIVE = "holds", "contradicted", "inconclusive"


@dataclass(frozen=True)
class Sample:
    """A measured value and its noise: ``value`` +- ``noise`` (same unit), from ``runs``."""

    value: float
    noise: float
    runs: tuple[float, ...] = ()

    @classmethod
    def of(cls, runs: Sequence[float], statistic: str = "median") -> Sample:
        """The value of repeated runs (``statistic``: ``min`` for times and bubbles, which noise
        only lengthens; ``median`` for ratios of alternated pairs) and their half-spread as the
        noise. A single run has no measured noise: ``nan`` (``judge`` then cannot say holds)."""
        xs = tuple(float(x) for x in runs)
        if not xs or any(math.isnan(x) for x in xs):
            raise ValueError(f"a sample needs at least one number, got {list(runs)!r}")
        if statistic not in ("min", "median", "max"):
            raise ValueError(f"statistic {statistic!r} must be min, median or max")
        value = float(min(xs) if statistic == "min" else max(xs) if statistic == "max"
                      else statistics.median(xs))
        noise = (max(xs) - min(xs)) / 2 if len(xs) > 1 else math.nan
        return cls(value, noise, xs)

    @classmethod
    def ratio(cls, numerators: Sequence[float], denominators: Sequence[float]) -> Sample:
        """The ratio of two alternated variants, pair by pair (each pair shares the load of its
        moment), as the median of the pairs' ratios +- their half-spread."""
        if len(numerators) != len(denominators) or not numerators:
            raise ValueError(f"a ratio needs pairs: {len(numerators)} numerators, "
                             f"{len(denominators)} denominators")
        return cls.of([a / b for a, b in zip(numerators, denominators)], "median")

    @property
    def relative_noise(self) -> float:
        return abs(self.noise / self.value) if self.value else math.inf


@dataclass(frozen=True)
class Claim:
    """What a rule says the measured value must be: the closed interval [lo, hi]."""

    lo: float
    hi: float
    says: str
    """The rule in words, e.g. "bucketed DDP's step is shorter than naive DDP's"."""

    @classmethod
    def above(cls, bound: float, says: str) -> Claim:
        """A direction: the value exceeds ``bound`` (e.g. a ratio above 1: "faster")."""
        return cls(bound, math.inf, says)

    @classmethod
    def below(cls, bound: float, says: str) -> Claim:
        return cls(-math.inf, bound, says)

    @classmethod
    def near(cls, predicted: float, margin: float, says: str) -> Claim:
        """Agreement with a prediction to within ``margin`` (same unit)."""
        return cls(predicted - margin, predicted + margin, says)

    @classmethod
    def within_factor(cls, predicted: float, factor: float, says: str) -> Claim:
        """Agreement with a positive prediction to within a factor (1.5: from p/1.5 to 1.5p)."""
        if predicted <= 0 or factor < 1:
            raise ValueError(f"within_factor needs a positive prediction ({predicted}) and a "
                             f"factor >= 1 ({factor})")
        return cls(predicted / factor, predicted * factor, says)


@dataclass(frozen=True)
class Verdict:
    """``word`` (holds / contradicted / inconclusive) with the numbers it judged."""

    word: str
    claim: Claim
    sample: Sample
    what: str
    """The measured quantity in words, e.g. "naive / bucketed step time"."""
    fmt: str = ".3g"
    premise: str = ""
    """A premise of the rule this run lacked (``judge``'s): why it is inconclusive."""

    @property
    def holds(self) -> bool:
        return self.word == HOLDS

    def _band(self) -> str:
        s, f = self.sample, self.fmt
        if math.isnan(s.value):
            return "not measured"
        if math.isnan(s.noise):
            return f"{s.value:{f}} (one run: noise not measured)"
        return f"{s.value:{f}} +- {s.noise:{f}}"

    def _interval(self) -> str:
        c, f = self.claim, self.fmt
        if math.isinf(c.hi):
            return f"above {c.lo:{f}}"
        if math.isinf(c.lo):
            return f"below {c.hi:{f}}"
        return f"from {c.lo:{f}} to {c.hi:{f}}"

    def sentence(self) -> str:
        """The lesson's sentence: the rule, the judged numbers, and the verdict."""
        head = f"{self.claim.says}: {self.what} {self._band()}, the rule wants {self._interval()}"
        if self.word == HOLDS:
            return f"{head} -- holds"
        if self.word == CONTRADICTED:
            return f"{head} -- contradicted by this run"
        noise = self.sample.relative_noise
        why = (self.premise if self.premise else
               "one run cannot tell" if math.isnan(self.sample.noise) else
               f"noise +-{noise:.0%}" if math.isfinite(noise) else "noise too large")
        return f"{head} -- inconclusive on this machine ({why})"


def judge(sample: Sample, claim: Claim, what: str, fmt: str = ".3g",
          premise: str = "") -> Verdict:
    """Holds when ``sample``'s whole noise band lies inside ``claim``, contradicted when it
    lies wholly outside, else inconclusive. Unmeasured noise (one run) never holds: it is
    contradicted only when the value misses the claim by more than the claim is wide (or,
    for a direction, by more than 10 % of the bound's size). ``premise``: a premise of the
    rule the run lacked on purpose (4 ranks on 2 cores for a rule about ranks with a core
    each): inconclusive whatever the numbers, saying which -- a verdict that the time of day
    would flip between holds and contradicted."""
    v, n = sample.value, sample.noise
    if premise:
        return Verdict(INCONCLUSIVE, claim, sample, what, fmt, premise)
    if math.isnan(v):
        word = INCONCLUSIVE
    elif math.isnan(n):
        inside = claim.lo <= v <= claim.hi
        width = claim.hi - claim.lo if math.isfinite(claim.hi - claim.lo) else \
            max(0.1 * abs(claim.lo if math.isfinite(claim.lo) else claim.hi), 1e-12)
        far = v < claim.lo - width or v > claim.hi + width
        word = CONTRADICTED if (not inside and far) else INCONCLUSIVE
    elif claim.lo < v - n and v + n < claim.hi:
        word = HOLDS
    elif v + n < claim.lo or v - n > claim.hi:
        word = CONTRADICTED
    else:
        word = INCONCLUSIVE
    return Verdict(word, claim, sample, what, fmt)
