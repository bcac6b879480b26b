"""What hardware a run can use, found without importing torch when there is no GPU.

The supervisor validates a config (and picks ``backend="auto"``) in the parent process,
which must stay light: importing torch costs over a second, so we only ask torch about CUDA
when an NVIDIA driver is present at all. Tests replace ``gpu_count`` with a mock to cover
the GPU paths on CPU-only machines.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from labkit.base.cpuload import cpu_count
from labkit.base.errors import LabError


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


class GpuUnavailable(LabError):
    """A rank could not claim its GPU: too few are visible, or one is busy / out of memory."""


def physical_gpu(local_rank: int) -> str:
    """The GPU ``cuda:local_rank`` really is: its entry in CUDA_VISIBLE_DEVICES (or the index)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if local_rank < len(ids):
            return ids[local_rank]
    return str(local_rank)


def claim_gpu(local_rank: int, cuda: Any = None) -> int:
    """Bind this rank to ``cuda:local_rank`` (one GPU per rank) and make sure it is usable.

    Creating the CUDA context here (``mem_get_info``) turns "all CUDA-capable devices are
    busy or unavailable" (another process holds a GPU in exclusive mode) or a full GPU into
    one clear ``GpuUnavailable`` naming the GPU, instead of an NCCL error deep in a step.
    """
    if cuda is None:
        import torch

        cuda = torch.cuda
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    count = int(cuda.device_count())
    if local_rank >= count:
        raise GpuUnavailable(
            f"local rank {local_rank} needs GPU cuda:{local_rank}, but only {count} GPU(s) are "
            f"visible (CUDA_VISIBLE_DEVICES={visible}); the rule is one GPU per rank: start at "
            f"most {count} rank(s) on this node, e.g. world_size={max(count, 1)}, or use "
            f"backend='gloo'")
    gpu = physical_gpu(local_rank)
    try:
        cuda.set_device(local_rank)
        cuda.mem_get_info(local_rank)
    except RuntimeError as err:
        raise GpuUnavailable(
            f"GPU cuda:{local_rank} (physical GPU {gpu}, CUDA_VISIBLE_DEVICES={visible}) is "
            f"busy or unavailable: {str(err).strip().splitlines()[0]}. Another process may "
            f"hold it (exclusive compute mode) or fill its memory: check `nvidia-smi`, pick "
            f"free GPUs with CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=2,3), or use "
            f"backend='gloo'") from err
    return local_rank
