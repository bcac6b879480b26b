"""``labkit.lessons.dedicated.fitted_bench``: an all-reduce bench whose times do not grow with
the message size (a stalled small call on a busy machine) is run again with twice the calls,
the lesson is told why; after the last try the line is fitted to each size's fastest call,
and only where not even those fit does the error name the times (lesson 01's section 2 once
crashed on a None fit under the suite's load, and stopped Run All beside two hogs)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from labkit.base.errors import LabError
from labkit.lessons.dedicated import fitted_bench

FIT = {"alpha_s": 1e-4, "bandwidth_gbps": 1.0}


def _runner(fits: list[dict[str, Any] | None], fastest: dict[str, Any] | None = None
            ) -> tuple[Any, list[dict[str, Any]]]:
    asked: list[dict[str, Any]] = []

    def run(**kwargs: Any) -> Any:
        asked.append(kwargs)
        results = [{"time_s": t, "fastest_s": f}  # 4 KB's median slowest: a stall
                   for t, f in ((0.003, 0.0004), (0.001, 0.0008), (0.002, 0.0015))]
        return SimpleNamespace(metrics={"alpha_beta": fits[len(asked) - 1], "results": results,
                                        "alpha_beta_fastest": fastest})

    return run, asked


def test_a_bench_that_fits_is_run_once() -> None:
    run, asked = _runner([FIT])
    said: list[str] = []
    assert fitted_bench(run, "ring", iters=4, say=said.append).metrics["alpha_beta"] == FIT
    assert [a["options"]["iters"] for a in asked] == [4] and not said
    assert asked[0]["options"]["impl"] == "ring" and asked[0]["strategy"] == "allreduce-bench"


def test_an_unfittable_bench_runs_again_with_twice_the_calls_and_says_why() -> None:
    run, asked = _runner([None, None, FIT])
    said: list[str] = []
    assert fitted_bench(run, iters=4, say=said.append).metrics["alpha_beta"] == FIT
    assert [a["options"]["iters"] for a in asked] == [4, 8, 16]
    assert len(said) == 2 and "[3.0, 1.0, 2.0] ms" in said[0] and "16 calls" in said[1]


def test_no_fit_in_any_try_names_the_times() -> None:
    run, asked = _runner([None, None, None])
    with pytest.raises(LabError, match=r"in 3 tries .*4KB to 4MB: \[3.0, 1.0, 2.0\] ms"):
        fitted_bench(run, tries=3)
    assert len(asked) == 3


def test_medians_that_never_fit_fall_back_on_each_sizes_fastest_call() -> None:
    """Beside two hogs the 4 KB median stalled past the 4 MB one in all three tries: the line
    is then fitted to the fastest calls (which a stall cannot shorten), and the lesson says so
    with both sets of times instead of stopping."""
    fast = {"alpha_s": 3e-4, "bandwidth_gbps": 4.0}
    run, asked = _runner([None, None, None], fastest=fast)
    said: list[str] = []
    bench = fitted_bench(run, "ring", iters=4, say=said.append)
    assert bench.metrics["alpha_beta"] == {**fast, "statistic": "fastest call"}
    assert [a["options"]["iters"] for a in asked] == [4, 8, 16]  # the medians had every try
    assert "fitted to each size's fastest call ([0.4, 0.8, 1.5] ms)" in said[-1]
    assert "[3.0, 1.0, 2.0] ms" in said[-1]
