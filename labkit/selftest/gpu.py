"""The GPU's own rows: its allocator's peak around a ZeRO run, a timed matmul beside the
datasheet (fp32 and bf16), CUDA events against the host clock, the MFU of a GPT trained in
bf16 on one GPU, and ``nvidia-smi topo -m``.

With fewer GPUs than ranks (one GPU, two ranks: NCCL refuses two ranks on one device) the
rank rows run on gloo on the CPU cores, and the rows one GPU can run run on a one-rank NCCL
pool: the matmuls, the events, the GPT's MFU and ZeRO's allocator peak at N_d = 1.

The functions named ``*_on_rank`` run on the ranks (``Pool.launch``), where the GPU is: the
process that runs the self-test never creates a CUDA context (a forked rank could not use
it, and the fork server must start clean). Without a GPU every row here says
"skipped: no GPU" and why torch sees none.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from labkit.launchers.pool import Pool
from labkit.selftest import judge_devices
from labkit.selftest.datasheet import datasheet_for
from labkit.selftest.rows import FAIL, Row, skipped
from labkit.selftest.topology import nvidia_smi_topo, parse_topo, visible_gpu_ids

MATMUL_N = {"fp32": 8192, "bf16": 8192}
"""Square matmuls big enough to saturate a datacenter GPU (2 n^3 = 1.1 TFLOP each)."""


def no_gpu_reason() -> str:
    """Why torch sees no GPU here, in the words an instructor can act on."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return "no GPU: CUDA_VISIBLE_DEVICES hides every GPU"
    try:
        import torch
    except ImportError:
        return "no GPU: torch is not installed"
    if torch.version.cuda is None:
        return f"no GPU: this torch ({torch.__version__}) is a CPU build"
    if not (Path("/proc/driver/nvidia/gpus").is_dir() or Path("/dev/nvidia0").exists()):
        return "no GPU: no NVIDIA driver (/dev/nvidia0 is missing)"
    return "no GPU: torch.cuda.device_count() is 0"


def why_not(gpus: int, world_size: int) -> str:
    if gpus == 0:
        return no_gpu_reason()
    return (f"needs {world_size} GPUs (one per rank on NCCL), {gpus} visible: the {world_size}-"
            f"rank rows ran on gloo")


def gpu_names(timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Index and name of every GPU, from nvidia-smi (this process creates no CUDA context:
    in exclusive compute mode it would hold a GPU that a rank needs)."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [line.split(",", 1) for line in out.stdout.splitlines() if "," in line]
    return [{"index": int(i), "name": name.strip()} for i, name in rows if i.strip().isdigit()]


# ---- on the ranks --------------------------------------------------------------------------
def reset_peak_on_rank(ctx: Any) -> int:
    import torch

    torch.cuda.synchronize(ctx.device)
    torch.cuda.reset_peak_memory_stats(ctx.device)
    return int(torch.cuda.memory_allocated(ctx.device))


def peak_on_rank(ctx: Any) -> int:
    import torch

    torch.cuda.synchronize(ctx.device)
    return int(torch.cuda.max_memory_allocated(ctx.device))


def matmul_on_rank(ctx: Any, dtype: str, n: int, seconds: float = 0.5) -> dict[str, Any]:
    """FLOP/s of back-to-back ``n x n`` matmuls, timed twice over the same work: by CUDA events
    recorded on the stream, and by the host clock around a synchronised loop."""
    import torch

    dev = ctx.device
    dt = torch.float32 if dtype == "fp32" else torch.bfloat16
    a = torch.randn(n, n, device=dev, dtype=dt)
    b = torch.randn(n, n, device=dev, dtype=dt)
    for _ in range(3):  # 1. warm up: cuBLAS handle, workspace, clocks
        a @ b
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    a @ b
    torch.cuda.synchronize(dev)
    count = max(10, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()  # 2. the same work timed both ways
    start.record()
    for _ in range(count):
        a @ b
    end.record()
    end.synchronize()
    host_s = time.perf_counter() - t0
    event_s = start.elapsed_time(end) / 1e3
    return {"flops": 2 * n**3 * count / event_s, "event_s": event_s, "host_s": host_s,
            "name": torch.cuda.get_device_name(dev), "count": count,
            "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)}


# ---- in the parent ---------------------------------------------------------------------------
def reset_peaks(pool: Pool) -> list[int]:
    """Zero every rank's allocator peak; returns what each rank holds now (the baseline)."""
    return list(pool.launch(reset_peak_on_rank).results)


def read_peaks(pool: Pool) -> list[int]:
    return list(pool.launch(peak_on_rank).results)


def zero_phases(model: Any, batch_size: int, transient: int, activations: int,
                elt: int = 4) -> dict[str, float]:
    """What each phase of a ZeRO run on an MLP (``elt`` bytes per working value) adds to the
    model states on a GPU, read from the code (``labkit.train.parallel.zero_units``,
    ``labkit.train.loop``):

    * forward/backward: labkit's transient buffers (its ``Meter``: gathered layers, a
      layer's flat gradient before its reduce), the saved activations, the batch (fp32
      inputs, int64 labels) and one weight gradient autograd makes before it is copied in;
    * the end of the run: ``final_state`` gathers the whole fp32 model (4 bytes x Psi) to
      hash it, plus one unit's gather buffer.
    (The update's Adam temporaries, 4 bytes x the optimizer's shard, stay below the end.)"""
    widths = [model.in_dim] + [model.width] * model.depth + [model.out_dim]
    largest = max(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    return {"forward/backward": transient + activations + batch_size * (model.in_dim * 4 + 8)
            + elt * largest, "end-of-run gather": 4 * model.parameters() + 4 * largest}


def device_rows(pool: Pool | None, gpus: int) -> list[Row]:
    """Datasheet fp32 / bf16 and CUDA events on ``pool``'s GPUs (the slowest GPU is shown)."""
    names = ("datasheet_fp32", "fp32 matmul peak vs the datasheet"), \
            ("datasheet_bf16", "bf16 matmul peak vs the datasheet"), \
            ("cuda_events", "CUDA-event timing vs the host clock")
    if pool is None:
        why = no_gpu_reason() if gpus == 0 else "no GPU pool"
        return [skipped(k, "09" if k != "cuda_events" else "00", c, "cuda", why)
                for k, c in names]
    rows = []
    for dtype in ("fp32", "bf16"):
        got = min(pool.launch(matmul_on_rank, dtype, MATMUL_N[dtype], timeout_s=120).results,
                  key=lambda g: g["flops"])
        rows.append(judge_devices.datasheet_peak(dtype, got["name"], got["flops"],
                                                 datasheet_for(got["name"])))
        rows[-1].values["allow_tf32"] = got["allow_tf32"]
        if dtype == "fp32":
            events = judge_devices.cuda_event_timing(got["event_s"], got["host_s"])
    rows.append(events)
    return rows


GPT_MFU_MODEL: dict[str, Any] = {"kind": "gpt", "width": 2048, "depth": 4, "heads": 16, "seq_len": 512}
"""The GPT one GPU trains for the MFU row: 12 L h^2 = 201M matmul weights (under labkit's
250M cap), 128-wide heads, 512 tokens: big enough for the tensor cores to dominate."""


def gpt_mfu(pool: Pool | None, steps: int = 8) -> list[Row]:
    """A 1-rank GPT run in bf16 mixed precision (``labkit.run ddp --precision bf16``) on one
    GPU: its model FLOPs against PaLM's count and its MFU against the bf16 matmul peak
    measured on this GPU (``labkit calibrate --device cuda --dtype bf16``)."""
    from labkit.analysis.calibrate import calibrate
    from labkit.selftest.sizes import batch_for

    if pool is None:
        return [skipped("gpt_mfu_bf16", "09", "MFU of a 1-rank GPT (bf16) vs the measured bf16 "
                        "peak", "cuda", no_gpu_reason())]

    model = dict(GPT_MFU_MODEL)
    h, layers, seq = int(model["width"]), int(model["depth"]), int(model["seq_len"])
    weights = 12 * layers * h * h + 96 * h  # the blocks' matmuls, and the 96-character head
    peak = calibrate("cuda", dtype="bf16")
    batch = batch_for(weights * seq, peak["peak_flops_per_s"] if peak else 400e12, lo=8, hi=256)
    r = pool.run(strategy="ddp", world_size=pool.world_size, backend=pool.backend,
                 model=model, batch_size=batch, steps=steps, progress=False,
                 optimizer="adam", options={"precision": "bf16"}, timeout_s=300)
    m = r.metrics
    return [judge_devices.gpt_mfu(m.get("mfu"), m["flops_per_step"], weights, layers, h, seq,
                                  batch * pool.world_size, m.get("peak_flops_per_s"),
                                  m.get("peak_source", "?"), m.get("mfu_note"))]


def topology_row(gpus: int) -> Row:
    check = "GPU links (nvidia-smi topo -m) and TP placement"
    if gpus == 0:
        return skipped("topology", "04", check, "host", no_gpu_reason())
    text = nvidia_smi_topo()
    if text is None:
        return skipped("topology", "04", check, "host", "nvidia-smi is missing or failed: the "
                       "links between GPUs are unknown")
    try:
        topo = parse_topo(text)
    except ValueError as err:
        return Row(key="topology", lesson="04", check=check, backend="host", status=FAIL,
                   note=f"could not read nvidia-smi topo -m: {err}", values={"raw": text})
    row = judge_devices.gpu_topology(topo, visible_gpu_ids(gpus), gpus)
    row.values["raw"] = text
    return row
