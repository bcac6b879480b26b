"""Run every check in order and collect the rows, whatever fails.

A check that raises (a rank died, a run timed out, a metric is missing) becomes a FAIL row
naming the error, and the next check still runs: the table is what an instructor pastes
into a ticket, so it must come back whole. The pool is closed on every way out, Ctrl-C
included (``labkit.Pool`` as a context manager).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from labkit.base import devices
from labkit.launchers.pool import Pool
from labkit.selftest import checks, gpu, judge_devices
from labkit.selftest.rows import FAIL, Row, SelftestReport
from labkit.selftest.sizes import cpu_sizes, gpu_sizes
from labkit.selftest.topology import numa_nodes

WORLD_SIZE = 2
"""Ranks per check: two cores on the smallest lab machine, two GPUs on a server."""


def _failed(check: Callable[..., list[Row]], err: BaseException) -> Row:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return Row(key=check.__name__, lesson="--", check=check.__name__.replace("_", " "),
               backend="-", status=FAIL, note=f"{type(err).__name__}: {first}")


def _guarded(check: Callable[..., list[Row]], *args: Any) -> list[Row]:
    t0 = time.perf_counter()
    try:
        rows = check(*args)
    except Exception as err:  # noqa: BLE001 -- every failure is a row; the table comes back whole
        rows = [_failed(check, err)]
    for row in rows:
        row.seconds = (time.perf_counter() - t0) / len(rows)
    return rows


SIZING = ("the GPU's fp32 matmul peak, to size the GPU rows (labkit calibrate --device cuda: "
          "about a minute the first time, cached after)")
"""What the self-test says before measuring the GPU it sizes its runs for."""


def _gpu_peak() -> float:
    """The fp32 matmul peak of one GPU (``labkit calibrate --device cuda``), for sizing."""
    from labkit.analysis.calibrate import calibrate

    measured = calibrate("cuda")
    return float(measured["peak_flops_per_s"]) if measured else 20e12


@contextmanager
def _gpu_pool(main: Pool, gpus: int) -> Iterator[Pool | None]:
    """The pool the GPU's own rows run on: the main one on NCCL, else one rank on one GPU."""
    if main.backend == "nccl":
        yield main
    elif gpus >= 1:
        with Pool(1, backend="nccl") as one:
            yield one
    else:
        yield None


def machine(backend: str, world_size: int, gpus: int) -> dict[str, Any]:
    names = gpu.gpu_names() if gpus else []
    return {"platform": platform.platform(), "python": sys.version.split()[0],
            "cpu_cores": devices.cpu_count(), "gpus": names, "backend": backend,
            "world_size": world_size, "load_before": os.getloadavg()[0]}


ONE_GPU_NOTE = "ran on gloo on the CPU cores: NCCL needs one GPU per rank, {gpus} visible"
"""Why a rank row beside a GPU ran on gloo. gloo's CUDA tensors are no way out: two ranks
on one GPU would share its time, and gloo has no CUDA reduce-scatter."""


def run_selftest(on_row: Callable[[Row], None] | None = None,
                 on_start: Callable[[str], None] | None = None) -> SelftestReport:
    """Every lesson's point checked on this machine; ``on_row`` sees each row as it lands,
    ``on_start`` what starts next (a check's name, the pool's start) before it runs."""
    t0 = time.perf_counter()

    def starting(what: str) -> None:
        if on_start is not None:
            on_start(what)

    def guarded(check: Callable[..., list[Row]], *args: Any) -> list[Row]:
        starting(check.__name__.replace("_", " "))
        return _guarded(check, *args)

    gpus = devices.gpu_count()
    backend = "nccl" if gpus >= WORLD_SIZE else "gloo"
    if gpus:  # on a fresh GPU server this is the longest silent wait (87 s on the H200)
        starting(SIZING)
    sizes = gpu_sizes(_gpu_peak()) if gpus else cpu_sizes()
    rank_sizes = sizes if backend == "nccl" else cpu_sizes()
    report = SelftestReport(rows=[], machine=machine(backend, WORLD_SIZE, gpus))

    def add(rows: list[Row]) -> None:
        report.rows.extend(rows)
        for row in rows:
            if on_row is not None:
                on_row(row)

    def on_gloo(rows: list[Row]) -> list[Row]:
        """Rank rows that ran on gloo beside a GPU say why (one GPU, two ranks)."""
        if 0 < gpus < WORLD_SIZE:
            for row in rows:
                if row.backend == "gloo":
                    why = ONE_GPU_NOTE.format(gpus=gpus)
                    row.note = f"{row.note}; {why}" if row.note else why
        return rows

    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    add([judge_devices.cpu_topology(numa_nodes(), usable, WORLD_SIZE)])
    add([gpu.topology_row(gpus)])
    starting(f"{WORLD_SIZE} ranks on {backend}, one warm pool for every check")
    with Pool(WORLD_SIZE, backend=backend) as pool:
        bench = checks.Bench(pool, rank_sizes, gpus)
        for check in checks.RANK_CHECKS:
            add(on_gloo(guarded(check, bench)))
        with _gpu_pool(pool, gpus) as gpu_pool:
            add(guarded(gpu.device_rows, gpu_pool, gpus))
            if gpu_pool is not None and gpu_pool is not pool:  # one GPU: N_d = 1 on it
                add(guarded(checks.zero_one_gpu, checks.Bench(gpu_pool, sizes, gpus)))
            add(guarded(gpu.gpt_mfu, gpu_pool))
    report.machine["load_after"] = os.getloadavg()[0]
    report.machine["sizes"] = rank_sizes.device
    if gpus:
        report.machine["gpu_sizes"] = sizes.device
    report.wall_s = time.perf_counter() - t0
    return report
