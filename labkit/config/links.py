"""The wire between emulated nodes: link presets named after real interconnects, and specs.

Teaches: a link is two numbers, a bandwidth and a latency (the alpha-beta model of
``labkit.theory.comm``), and real interconnects differ by orders of magnitude in both
(seed 001's table; ``labkit.theory.interconnect.INTERCONNECTS`` holds the figures).

Two cores cannot move 25 GB/s, so every preset is its real link *slowed down* by one
time-dilation factor ``SCALE``: bandwidth / SCALE and latency x SCALE. Dilating time keeps
what matters for the lessons: the ratio between any two links (NVLink 4 is still 18x
InfiniBand HDR) and the message size at which latency and bandwidth cost the same
(``alpha x bandwidth``: 125 KB for InfiniBand HDR, real or emulated). ``SCALE = 500`` makes
NVLink 4 (450 GB/s) 0.9 GB/s, about what gloo moves between two processes over loopback
on a 2-core laptop, so "inside a node" (loopback) plays NVLink and the shaped link plays the
network between nodes:

=================  ===========================  ==============  ================
preset             real link, per direction     emulated rate   emulated latency
=================  ===========================  ==============  ================
nvlink4, nvswitch  450 GB/s, 2-3 us             7.2 Gbit/s      1-1.5 ms
nvlink3            300 GB/s, 2 us               4.8 Gbit/s      1 ms
pcie4              31.5 GB/s, 3 us              504 Mbit/s      1.5 ms
pcie5              63 GB/s, 3 us                1008 Mbit/s     1.5 ms
infiniband_hdr     25 GB/s (200 Gb/s), 5 us     400 Mbit/s      2.5 ms
infiniband_ndr     50 GB/s (400 Gb/s), 5 us     800 Mbit/s      2.5 ms
ethernet_100g      12.5 GB/s, 10 us             200 Mbit/s      5 ms
ethernet_25g       3.125 GB/s, 20 us            50 Mbit/s       10 ms
ethernet_10g       1.25 GB/s, 50 us             20 Mbit/s       25 ms
=================  ===========================  ==============  ================

The fast presets (NVLink) exceed what a 2-core machine can shape and carry; they are there
for completeness and to compare against, the lessons use InfiniBand and Ethernet.

A spec is a preset name or ``"RATE[,LATENCY]"`` in tc's units: ``"200mbit"``,
``"1.5gbit,2ms"``, ``"5mbit,300us"`` (bits per second, decimal: 1 mbit = 1e6 bit/s;
latency one-way, added to every packet crossing the link).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from labkit.base.errors import ConfigError
from labkit.theory.interconnect import INTERCONNECTS, Interconnect

SCALE = 500
"""Time dilation of every preset: bandwidth / SCALE, latency x SCALE."""
MIN_RATE_BPS = 1e6
MAX_RATE_BPS = 10e9
MAX_LATENCY_S = 1.0
EXAMPLE = "'200mbit', '1gbit,2ms' or a preset such as 'infiniband_hdr'"

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_NUMBER = r"(-?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"  # a sign, so -5gbit meets the range rule
_RATE_RE = re.compile(rf"^{_NUMBER}\s*([a-z]+)$")
_TIME_RE = re.compile(rf"^{_NUMBER}\s*([a-z]+)$")


class LinkWarning(UserWarning):
    """The link could not be shaped exactly as asked (e.g. no netem for the latency)."""


@dataclass(frozen=True)
class LinkSpec:
    """What the emulated link between nodes is shaped to."""

    text: str
    """The spec as given (a preset name or RATE[,LATENCY])."""
    rate_bps: float
    """Bits per second each direction of the link carries (tc's tbf rate)."""
    latency_s: float
    """One-way latency added to every packet crossing the link, seconds (netem delay)."""
    preset: str | None = None
    real: Interconnect | None = None
    """The real link a preset emulates (its figures before scaling)."""

    @property
    def bytes_per_s(self) -> float:
        return self.rate_bps / 8

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec": self.text, "preset": self.preset,
                               "rate_bps": self.rate_bps, "latency_s": self.latency_s}
        if self.real is not None:
            out.update(real_bandwidth_Bps=self.real.bandwidth_Bps, real_alpha_s=self.real.alpha_s,
                       scale=SCALE, real_note=self.real.note)
        return out

    def __str__(self) -> str:
        lat = f", {self.latency_s * 1e3:g} ms" if self.latency_s else ""
        name = f"{self.preset}: " if self.preset else ""
        return f"{name}{format_rate(self.rate_bps)}{lat}"


def preset(name: str) -> LinkSpec:
    """The emulated version of ``INTERCONNECTS[name]``: bandwidth / SCALE, latency x SCALE."""
    real = INTERCONNECTS[name]
    return LinkSpec(text=name, rate_bps=real.bandwidth_Bps * 8 / SCALE,
                    latency_s=real.alpha_s * SCALE, preset=name, real=real)


PRESETS: dict[str, LinkSpec] = {name: preset(name) for name in INTERCONNECTS}
"""Every interconnect of ``labkit.theory.INTERCONNECTS``, scaled for this lab."""


def parse_link(text: str) -> LinkSpec:
    """``"infiniband_hdr"`` -> its preset; ``"200mbit,1ms"`` -> 200e6 bit/s, 1 ms.

    Raises ``ConfigError`` naming the value, the rule and valid examples.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"link ({text!r}) must be a preset name or RATE[,LATENCY]; "
                          f"e.g. {EXAMPLE}")
    key = text.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    rate_text, _, latency_text = key.partition(",")
    problems = []
    rate = _parse(rate_text.strip(), _RATE_RE, _RATE_UNITS)
    if rate is None:
        problems.append(
            f"link rate {rate_text.strip()!r} in {text!r} must be a number with a unit bit, "
            f"kbit, mbit or gbit, or the link a preset ({', '.join(PRESETS)}); e.g. {EXAMPLE}")
    elif not MIN_RATE_BPS <= rate <= MAX_RATE_BPS:
        problems.append(f"link rate {rate_text.strip()!r} ({rate:.3g} bit/s) must be between "
                        f"{format_rate(MIN_RATE_BPS)} and {format_rate(MAX_RATE_BPS)} (slower "
                        f"runs crawl, faster ones exceed what the CPU can shape); e.g. '200mbit'")
    latency = 0.0
    if latency_text.strip():
        parsed = _parse(latency_text.strip(), _TIME_RE, _TIME_UNITS)
        if parsed is None:
            problems.append(f"link latency {latency_text.strip()!r} in {text!r} must be a number "
                            f"with a unit us, ms or s; e.g. '200mbit,1ms'")
        elif parsed < 0:
            problems.append(f"link latency {latency_text.strip()!r} must be >= 0 (a wire cannot "
                            f"deliver before it sends); e.g. '200mbit,1ms'")
        elif parsed > MAX_LATENCY_S:
            problems.append(f"link latency {latency_text.strip()!r} must be at most "
                            f"{MAX_LATENCY_S:g} s; e.g. '200mbit,5ms'")
        else:
            latency = parsed
    if problems:
        raise ConfigError(problems)
    assert rate is not None
    return LinkSpec(text=text.strip(), rate_bps=rate, latency_s=latency)


def _parse(text: str, pattern: re.Pattern[str], units: dict[str, float]) -> float | None:
    m = pattern.match(text)
    if m is None or m.group(2) not in units:
        return None
    return float(m.group(1)) * units[m.group(2)]


def format_rate(bps: float) -> str:
    """200e6 -> '200 Mbit/s' (decimal units, as tc counts)."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def as_interconnect(link: dict[str, Any], name: str | None = None) -> Interconnect:
    """A measured link (``metrics["link"]``) as an ``Interconnect`` for the alpha-beta model.

    Uses what the probe measured (TCP goodput, half the round trip) where it ran, else the
    shaped rate and latency.
    """
    bps = link.get("measured_bps") or link["rate_bps"]
    alpha = link.get("measured_latency_s")
    if alpha is None:
        alpha = link.get("latency_s") or 0.0
    return Interconnect(name or f"link {link.get('spec')}", float(alpha), float(bps) / 8,
                        "inter-node", "measured between the emulated nodes")
