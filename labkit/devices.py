"""What hardware a run can use, found without importing torch when there is no GPU.

The supervisor validates a config (and picks ``backend="auto"``) in the parent process,
which must stay light: importing torch costs over a second, so we only ask torch about CUDA
when an NVIDIA driver is present at all. Tests replace ``gpu_count`` with a mock to cover
the GPU paths on CPU-only machines.
"""

from __future__ import annotations

import os
from pathlib import Path


def cpu_count() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _driver_present() -> bool:
    return Path("/proc/driver/nvidia/gpus").is_dir() or Path("/dev/nvidia0").exists()


def gpu_count() -> int:
    """CUDA devices visible to this process (honours CUDA_VISIBLE_DEVICES); 0 without a driver."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    if not _driver_present():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_threads_per_rank(world_size: int) -> int:
    """Torch intra-op threads per rank so N ranks share the cores without oversubscribing."""
    return max(1, cpu_count() // max(1, world_size))
