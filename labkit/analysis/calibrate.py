"""This machine's peak matmul FLOP/s: the denominator of MFU, measured once and cached.

How it is measured: in a fresh process (so nothing else of labkit competes), torch multiplies
two fp32 ``n x n`` matrices (``2 n^3`` FLOPs each) back to back for about a third of a
second, three rounds, and keeps the best round. On a CPU it uses every core this process may
run on (one rank per core is the lab's fair setting, so the machine's peak is all cores
together); on a GPU, one GPU, and a run's peak is that times its GPU ranks. fp32, because
labkit trains in fp32: MFU then says how much of the arithmetic this machine can do in the
run's own precision was spent on the model.

The result is cached in ``$LABKIT_CACHE/peak_flops.json`` (default ``~/.cache/labkit``),
keyed by host, torch version and device. ``labkit calibrate`` measures again; do it on a
quiet machine, since a busy one measures a lower peak and so overstates MFU.

The supervisor never imports torch: it reads the cache, and on a miss runs
``python -m labkit.analysis.calibrate`` once (a few seconds), under a file lock so concurrent runs
measure only once.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from labkit.base import devices


def cache_dir() -> Path:
    return Path(os.environ.get("LABKIT_CACHE", Path.home() / ".cache" / "labkit"))


def _key(device: str) -> str:
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    return f"{platform.node()}|torch {torch_version}|{device}|{devices.cpu_count()} cores"


def measure(device: str = "cpu", n: int = 1024, rounds: int = 3, seconds: float = 0.3
            ) -> dict[str, Any]:
    """Best-of-``rounds`` fp32 matmul FLOP/s on ``device`` (run in a fresh process)."""
    import torch

    if device == "cpu":
        torch.set_num_threads(devices.cpu_count())
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    a @ b  # warm-up: allocator, thread pool, cuBLAS handle
    sync()
    best = 0.0
    for _ in range(rounds):
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            count += 1
            if dev.type == "cuda" and count % 8 == 0:
                sync()
        sync()
        best = max(best, 2 * n**3 * count / (time.perf_counter() - t0))
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor()
    return {"peak_flops_per_s": best, "device": device, "name": name or platform.machine(),
            "threads": torch.get_num_threads() if dev.type == "cpu" else None,
            "matrix": n, "dtype": "float32", "measured_at": time.time()}


def _load() -> dict[str, Any]:
    path = cache_dir() / "peak_flops.json"
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def calibrate(device: str = "cpu", refresh: bool = False, timeout_s: float = 120.0
              ) -> dict[str, Any] | None:
    """The cached measurement for ``device``; measured in a subprocess when missing."""
    key = _key(device)
    if not refresh and key in _load():
        return _load()[key]  # type: ignore[no-any-return]
    import fcntl

    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "peak_flops.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs: one measures, the rest read
        if not refresh and key in _load():
            return _load()[key]  # type: ignore[no-any-return]
        try:
            proc = subprocess.run([sys.executable, "-m", "labkit.analysis.calibrate", "--device", device,
                                   "--json"], capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
            return None
        data = _load()
        data[key] = result
        tmp = cache_dir() / "peak_flops.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(cache_dir() / "peak_flops.json")
        return result


def machine_peak_flops(backend: str, world_size: int) -> float | None:
    """The peak FLOP/s a run could use: all CPU cores (gloo), or one GPU per rank (nccl)."""
    if backend == "nccl":
        one = calibrate("cuda")
        return one["peak_flops_per_s"] * world_size if one else None
    cpu = calibrate("cpu")
    return cpu["peak_flops_per_s"] if cpu else None


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m labkit.analysis.calibrate")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = measure(args.device)
    print(json.dumps(result) if args.json else
          f"{result['name']}: {result['peak_flops_per_s'] / 1e9:.1f} GFLOP/s fp32 matmul")
    return 0


if __name__ == "__main__":
    sys.exit(main())
