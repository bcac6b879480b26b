"""This machine's peak matmul FLOP/s: the denominator of MFU, measured with care and cached.

MFU (model FLOPs utilisation; Chowdhery et al. 2022, "PaLM", appendix B) divides the model
FLOPs a run does per second by the hardware's peak. A GPU's peak is on its datasheet; a
CPU's is not, so labkit measures the best fp32 matmul rate ``torch.mm`` reaches here, in
the run's own precision (labkit trains in fp32). A peak measured too low makes MFU lie
(above 100 %), so:

1. *The threads the run uses.* In a fresh process with T = min(cores, world_size x threads
   per rank) threads: one process with T threads stands for the T cores the ranks share.
   On a GPU, one GPU; a run's peak is that times its GPU ranks.
2. *The best of several sizes.* Square matrices from 256 to 3072 (a 1024 x 1024 matmul
   reached only 54 GFLOP/s on the 2-core machine where 2048-3072 reach 85-124), and where a
   run beat them, the model's own GEMM shapes (m, k, n: forward, input and weight gradients
   of each layer; ``labkit.analysis.throughput``), best of three rounds each. A shape
   measured once is kept, so a new model measures only its new shapes. Shapes go smallest
   first, and one whose single matmul would take more than ``MAX_CALL_S`` at the best rate
   seen so far is left out (``skipped``, with that time): on a CPU without bf16
   instructions (AVX2 only) a bf16 matmul runs near 1 GFLOP/s, so a 3072-cube bf16 matmul
   takes about a minute, and the calibration before a bf16 run would outlive its own time
   limit, store nothing and start again at the next run.
3. *A busy machine is detected, and never lowers the peak.* During the measurement the CPU
   time of *other* processes is read from ``/proc/stat`` (minus this process's own), and
   the spread of the repeats of the best shape is checked: busy means others used more
   than ``max(0.25, 0.15 x cores)`` cores, or the repeats differ by more than 20 %.
   ``labkit calibrate`` then waits and tries again (three tries) and refuses with a
   message naming the load. Every shape keeps the best rate ever measured for it (noise
   only lowers a rate), so a busy measurement can raise the peak but never lower it; an
   entry measured only on a busy machine is marked so, and measured again once it is quiet.
4. *Keyed so nothing else can feed it.* ``$LABKIT_CACHE/peak_flops.json`` (default: the
   platform's cache directory, ``~/.cache/labkit`` on Linux) holds one entry per host,
   Python, torch version *and install path* (another torch build is another key), labkit
   checkout, device and thread count. The cache is best effort: where it cannot be written
   (a read-only HOME, a full disk) a warning says so and the peak is measured again next
   time; no run loses its result.

``labkit.analysis.throughput`` recalibrates when a run's model FLOP rate exceeds the peak,
and reports which peak it used (``peak_flops_per_s``, ``peak_source``, ``peak_age_s``). The
supervisor never imports torch: measurements run in ``python -m labkit.analysis.calibrate``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.base import devices, places
from labkit.base.cache import KeyedCache
from labkit.base.cpuload import busy_limit, cpu_sample, others_cores
from labkit.base.progress import Progress

SQUARE = (256, 512, 1024, 2048, 3072)
"""Square sizes every CPU calibration tries (GPU: ``GPU_SQUARE``)."""
GPU_SQUARE = (2048, 4096, 8192)
ROUNDS = 3
TRIES = 3
"""How many times ``labkit calibrate`` measures a busy machine before refusing."""
MAX_CALL_S = 2.0
"""The longest one matmul of a calibration may take, estimated from the best rate measured
before it (smaller shapes, or the cached peak): a larger shape is left out. fp32 is never
near it on a 2-core laptop (3072 cubed at 100 GFLOP/s: 0.6 s)."""
MAX_SPREAD = 0.20
"""Repeats of the best shape further apart than this (share of the best) mean noise."""
Shape = tuple[int, int, int]


def cache_dir() -> Path:
    """``$LABKIT_CACHE`` or the platform's user cache directory (``labkit.base.places``)."""
    return places.cache_dir()


_torch_build = places.torch_build


DTYPES = ("fp32", "bf16")
"""The precisions a peak is measured in: fp32 (labkit's default training) and bf16 (mixed
precision, ``--precision bf16``: on a GPU the tensor-core rate a datasheet quotes)."""


def _key(device: str, threads: int, dtype: str = "fp32") -> str:
    return (f"{places.machine_key(_torch_build())}|{device}|{threads} threads"
            + ("" if dtype == "fp32" else f"|{dtype}"))


# ---- 3. how busy the machine is while we measure -------------------------------------------
def busy_reason(others: float, spread: float, cores: int) -> str | None:
    """Why a measurement cannot be trusted (None: it can)."""
    limit = busy_limit(cores)
    load = os.getloadavg()[0]
    if others > limit:
        return (f"other processes used {others:.1f} of {cores} cores while it measured "
                f"(load average {load:.1f})")
    if spread > MAX_SPREAD:
        return (f"its repeats differed by {spread:.0%} (load average {load:.1f} on {cores} "
                f"cores)")
    return None


# ---- 1-2. the measurement (in a fresh process) ---------------------------------------------
def measure(device: str = "cpu", threads: int | None = None, shapes: list[Shape] | None = None,
            rounds: int = ROUNDS, seconds: float = 0.1, dtype: str = "fp32",
            on_shape: Callable[[str], None] | None = None, known_rate: float = 0.0,
            max_call_s: float = MAX_CALL_S) -> dict[str, Any]:
    """Best-of-``rounds`` FLOP/s of every shape (m, k, n) in ``dtype`` (fp32 or bf16), and
    how busy the machine was; ``on_shape`` hears each shape (``"MxKxN"``) once done.
    Smallest shapes first; a shape whose one matmul would take over ``max_call_s`` at the
    best rate so far (or ``known_rate``, a cached peak) is left out: ``skipped`` holds its
    estimated seconds a call."""
    import torch

    dt = torch.bfloat16 if dtype == "bf16" else torch.float32

    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    if dev.type == "cpu":
        torch.set_num_threads(threads or devices.cpu_count())
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rates: dict[str, float] = {}
    spreads: dict[str, float] = {}
    skipped: dict[str, float] = {}
    before = cpu_sample(tree=False)  # the measurement runs in this process's threads
    for m, k, n in sorted(shapes or [], key=lambda s: s[0] * s[1] * s[2]):
        best = max([known_rate, *rates.values()])
        if best > 0 and 2 * m * k * n / best > max_call_s:
            skipped[f"{m}x{k}x{n}"] = 2 * m * k * n / best
            if on_shape is not None:
                on_shape(f"{m}x{k}x{n}")
            continue
        a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
        seen = []  # the first round pays the warm-up (allocator, threads, cuBLAS): best-of
        for _ in range(rounds):
            count, t0 = 0, time.perf_counter()
            while count == 0 or time.perf_counter() - t0 < seconds:
                a @ b
                count += 1
            sync()
            seen.append(2 * m * k * n * count / (time.perf_counter() - t0))
        rates[f"{m}x{k}x{n}"] = max(seen)
        spreads[f"{m}x{k}x{n}"] = (max(seen) - min(seen)) / max(seen)
        if on_shape is not None:
            on_shape(f"{m}x{k}x{n}")
    others = others_cores(before, cpu_sample(tree=False)) if dev.type == "cpu" else 0.0
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor()
    return {"rates": rates, "spreads": spreads, "skipped": skipped, "others_cores": others,
            "load": os.getloadavg()[0], "device": device, "name": name or platform.machine(),
            "threads": torch.get_num_threads() if dev.type == "cpu" else None,
            "dtype": "bfloat16" if dtype == "bf16" else "float32", "measured_at": time.time()}


def square(device: str) -> list[Shape]:
    return [(n, n, n) for n in (GPU_SQUARE if device == "cuda" else SQUARE)]


# ---- 4. the cache --------------------------------------------------------------------------
CACHE = KeyedCache("peak_flops", label="calibration", what="the peak")
"""``$LABKIT_CACHE/peak_flops.json``: one entry per ``_key`` (``labkit.base.cache``)."""


def _load() -> dict[str, Any]:
    """Every cached peak, by key."""
    return CACHE.load()


def _store(key: str, entry: dict[str, Any]) -> None:
    """Best effort: a cache that cannot be written (a read-only HOME, a full disk) costs a
    warning and a measurement next time, never the result of the run that asked."""
    CACHE.put(key, entry)


def summarize(entry: dict[str, Any]) -> dict[str, Any]:
    """The peak of a cache entry: its best shape's rate, that shape, and the entry's state."""
    rates = entry.get("rates") or {}
    best = max(rates, key=rates.get) if rates else None  # type: ignore[arg-type]
    busy = entry["busy"] if "busy" in entry else judge(entry)
    return {**entry, "peak_flops_per_s": rates[best] if best else 0.0, "shape": best,
            "busy": busy}


def judge(measured: dict[str, Any]) -> str | None:
    """Why one measurement cannot be trusted (``busy_reason`` of its best shape), or None."""
    if measured.get("device") != "cpu":
        return None
    rates = measured.get("rates") or {}
    best = max(rates, key=rates.get) if rates else None  # type: ignore[arg-type]
    spread = (measured.get("spreads") or {}).get(best, 0.0) if best else 0.0
    cores = measured.get("threads") or devices.cpu_count()
    return busy_reason(measured.get("others_cores", 0.0), spread, cores)


PROGRESS_TAG = "labkit-calibrate-shape "
"""How the measuring process tells its parent a shape is done (a line on its stderr)."""


def _run_measurement(device: str, threads: int, shapes: list[Shape], timeout_s: float,
                     dtype: str = "fp32", on_shape: Callable[[str], None] | None = None,
                     known_rate: float = 0.0) -> dict[str, Any] | None:
    """Measure ``shapes`` in a fresh process (None if it failed or outlived ``timeout_s``);
    ``on_shape`` hears each shape as that process finishes it; ``known_rate``: ``measure``'s."""
    spec = ";".join(f"{m},{k},{n}" for m, k, n in shapes)
    cmd = [sys.executable, "-m", "labkit.analysis.calibrate", "--device", device, "--threads",
           str(threads), "--shapes", spec, "--dtype", dtype, "--json", "--progress",
           "--known-rate", repr(float(known_rate))]
    try:
        with tempfile.TemporaryFile("w+") as out, \
                subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True) as proc:
            timer = threading.Timer(timeout_s, proc.kill)
            timer.start()
            try:
                assert proc.stderr is not None
                for line in proc.stderr:  # ends when the process exits (or is killed)
                    if line.startswith(PROGRESS_TAG) and on_shape is not None:
                        on_shape(line[len(PROGRESS_TAG):].strip())
                proc.wait()
            finally:
                timer.cancel()
            if proc.returncode != 0:
                return None
            out.seek(0)
            return json.loads(out.read().strip().splitlines()[-1])  # type: ignore[no-any-return]
    except (ValueError, IndexError, OSError):
        return None


def merge(old: dict[str, Any] | None, fresh: dict[str, Any]) -> dict[str, Any]:
    """One entry from two measurements: each shape's best rate (noise only ever lowers a
    rate, so the best seen is the truer peak), busy only while no quiet one was made."""
    if old is None:
        return dict(fresh)
    rates = dict(old.get("rates", {}))
    spreads = dict(old.get("spreads", {}))
    for shape, rate in fresh["rates"].items():
        if rate >= rates.get(shape, 0.0):
            rates[shape], spreads[shape] = rate, fresh.get("spreads", {}).get(shape, 0.0)
    skipped = {s: t for s, t in {**old.get("skipped", {}), **fresh.get("skipped", {})}.items()
               if s not in rates}  # a shape measured once is no longer left out
    quiet = not fresh.get("busy") or not old.get("busy")
    return {**fresh, "rates": rates, "spreads": spreads, "skipped": skipped,
            "busy": None if quiet else fresh.get("busy")}


def calibrate(device: str = "cpu", threads: int | None = None, shapes: list[Shape] | None = None,
              refresh: bool = False, tries: int = 1, timeout_s: float = 180.0,
              dtype: str = "fp32", progress: bool | None = None) -> dict[str, Any] | None:
    """The peak for ``device`` with ``threads``: cached shapes reused, missing ones (every
    shape with ``refresh``) measured in a subprocess, up to ``tries`` times while the machine
    is busy. ``"fresh"``: measured in this call; ``"now_busy"``: why this call's measurement
    could not be trusted (the cache then keeps the best rates seen, never lower ones).
    ``progress`` (``labkit.base.progress``'s rule, on stderr): a step per shape measured, a
    line per try."""
    threads = threads or devices.cpu_count()
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} must be one of {', '.join(DTYPES)}")
    key = _key(device, threads, dtype)
    wanted = sorted(set(square(device)) | set(shapes or []))
    with CACHE.locked() as writable:  # concurrent runs: one measures, the rest read
        old = _load().get(key)
        if old is not None and old.get("busy") and \
                os.getloadavg()[0] < 0.5 * devices.cpu_count():
            refresh = True  # measured on a busy machine only, and it is quiet now
        have = set() if refresh or old is None else \
            set(old.get("rates", {})) | set(old.get("skipped", {}))
        missing = [s for s in wanted if f"{s[0]}x{s[1]}x{s[2]}" not in have]
        if not missing:
            return summarize(old) if old is not None else None
        # the cached peak tells a fresh process which shapes would take too long a call
        known = summarize(old)["peak_flops_per_s"] if old is not None else 0.0
        fresh: dict[str, Any] | None = None
        what = _what(device, threads, dtype)
        with Progress(what, len(missing), unit="shape", enabled=progress) as shown:
            for attempt in range(tries):
                if attempt:
                    shown.note(f"{what}: try {attempt} of {tries} ran on a busy machine: "
                               f"{fresh['busy'] if fresh else '?'}; trying again in 2 s")
                    time.sleep(2.0)
                    shown.restart(f"{what}, try {attempt + 1} of {tries}")
                fresh = _run_measurement(device, threads, missing, timeout_s, dtype,
                                         on_shape=shown.step, known_rate=known)
                if fresh is None:
                    return summarize(old) if old is not None else None
                fresh["busy"] = judge(fresh)
                if not fresh["busy"]:
                    break
        assert fresh is not None
        merged = merge(old, fresh)
        if writable:
            _store(key, merged)
        return {**summarize(merged), "fresh": True, "now_busy": fresh["busy"]}


def _what(device: str, threads: int, dtype: str) -> str:
    """What a calibration measures, in the words its progress uses."""
    where = "one GPU" if device == "cuda" else f"{threads} CPU thread{'s' if threads > 1 else ''}"
    return f"measuring peak {dtype} matmul FLOP/s ({where})"


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m labkit.analysis.calibrate")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--shapes", default="", help="M,K,N;M,K,N... (default: the square sizes)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--known-rate", type=float, default=0.0,
                   help="FLOP/s already measured here: shapes whose one matmul would take "
                        f"over {MAX_CALL_S:g} s at it are left out")
    p.add_argument("--progress", action="store_true",
                   help=f"a line '{PROGRESS_TAG}MxKxN' on stderr as each shape is measured")
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";") if s]

    def tell(shape: str) -> None:
        print(PROGRESS_TAG + shape, file=sys.stderr, flush=True)

    result = measure(args.device, args.threads, shapes or square(args.device),  # type: ignore[arg-type]
                     dtype=args.dtype, on_shape=tell if args.progress else None,
                     known_rate=args.known_rate)
    peak = summarize(result)
    print(json.dumps(result) if args.json else
          f"{result['name']}: {peak['peak_flops_per_s'] / 1e9:.1f} GFLOP/s {args.dtype} matmul "
          f"({peak['shape']}, {result['threads'] or 1} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
