"""``labkit.lessons.cluster_predict.loopback_model`` (lesson 10's wire inside a node): a line
through the fastest call of each size; where even those do not grow with the size, the
benchmark's own fit, and where that is missing too, an error naming the times instead of a
``TypeError`` on a missing fit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from labkit.base.errors import LabError
from labkit.lessons.cluster_predict import loopback_model


def _bench(durations_ns: dict[int, list[int]], fit: dict[str, float] | None) -> Any:
    events = [SimpleNamespace(name="allreduce", bytes=size, start_ns=k, dur_ns=d)
              for size, ds in durations_ns.items() for k, d in enumerate(ds)]
    return SimpleNamespace(config=SimpleNamespace(options=SimpleNamespace(warmup=1)),
                           timeline=SimpleNamespace(select=lambda **_: events),
                           metrics={"alpha_beta": fit})


def test_the_fastest_calls_give_the_line() -> None:
    link = loopback_model(_bench({16_000: [9_000_000, 200_000, 300_000],
                                  1_000_000: [9_000_000, 1_200_000, 1_500_000]}, None))
    assert 0 < link.alpha_s < 2e-4 and link.bandwidth_Bps > 0


def test_the_benchmarks_own_fit_where_the_fastest_calls_do_not_grow() -> None:
    flat = {16_000: [0, 900_000, 900_000], 1_000_000: [0, 400_000, 400_000]}
    link = loopback_model(_bench(flat, {"alpha_s": 1e-4, "bandwidth_gbps": 2.0}))
    assert (link.alpha_s, link.bandwidth_Bps) == (1e-4, 2e9)
    with pytest.raises(LabError, match=r"did not grow with the message size \(\[0.9, 0.4\] ms"):
        loopback_model(_bench(flat, None))
