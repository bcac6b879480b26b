"""The GPU code paths, covered on a CPU-only machine with mocks.

``labkit.base.devices.gpu_count`` is monkeypatched to pretend GPUs exist, and a fake
``torch.cuda`` (Event / synchronize / set_device / mem_get_info) stands in for CUDA, so
these tests pin down: ``backend="auto"`` picks NCCL with one GPU per rank (and gloo with
too few), explicit ``nccl`` with too few GPUs or a busy GPU fails with a clear message,
``CUDA_VISIBLE_DEVICES`` is honoured end to end, and ``CudaTracer`` turns CUDA event times
into nanoseconds on the host clock correctly. Only the last test needs real GPUs.
"""

from __future__ import annotations

import importlib

import pytest

from labkit.base import devices
from labkit.base.errors import ConfigError
from labkit.base.events import Lane, Op
from labkit.config.run import RunConfig

pytestmark = [pytest.mark.lesson00]


# ---- backend selection ------------------------------------------------------------------
@pytest.mark.parametrize("gpus, world_size, want", [
    (2, 2, "nccl"), (8, 4, "nccl"), (1, 2, "gloo"), (0, 1, "gloo"), (3, 4, "gloo")])
def test_auto_backend_picks_nccl_only_with_one_gpu_per_rank(monkeypatch, gpus, world_size, want):
    """auto -> nccl iff GPUs visible >= world_size."""
    monkeypatch.setattr(devices, "gpu_count", lambda: gpus)
    cfg = RunConfig(strategy="ddp", world_size=world_size)
    assert cfg.resolved_backend() == want, f"{gpus} GPUs, world_size {world_size}"


def test_run_hands_nccl_to_the_ranks_when_auto_finds_gpus(monkeypatch):
    """labkit.run with auto and enough GPUs starts ranks with backend nccl (supervise mocked)."""
    seen = {}

    class Stop(Exception):
        pass

    def fake_supervise(job, world_size, timeout_s, on_progress=None):
        seen.update(backend=job.backend, world_size=world_size)
        raise Stop

    run_module = importlib.import_module("labkit.api")
    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    monkeypatch.setattr(run_module, "supervise", fake_supervise)
    with pytest.raises(Stop):
        run_module.run(strategy="ddp", world_size=2, steps=1, progress=False)
    assert seen == {"backend": "nccl", "world_size": 2}


def test_explicit_nccl_with_too_few_gpus_is_rejected_before_start(monkeypatch):
    """The error names world_size, the GPUs visible and a valid alternative."""
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    with pytest.raises(ConfigError) as err:
        RunConfig(strategy="ddp", world_size=2, backend="nccl")
    msg = str(err.value)
    assert "world_size (2)" in msg and "GPUs visible (1)" in msg and "gloo" in msg


# ---- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------
@pytest.mark.parametrize("visible", ["", "-1"])
def test_gpu_count_honours_hidden_gpus(monkeypatch, visible):
    """CUDA_VISIBLE_DEVICES="" or -1 hides every GPU, even when a driver is present."""
    monkeypatch.setattr(devices, "_driver_present", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert devices.gpu_count() == 0


def test_gpu_count_asks_torch_for_the_visible_set(monkeypatch):
    """With a driver, the count is what torch sees after CUDA_VISIBLE_DEVICES."""
    import torch

    monkeypatch.setattr(devices, "_driver_present", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.gpu_count() == 2


def test_ranks_inherit_the_students_gpu_selection(monkeypatch):
    """The supervisor passes CUDA_VISIBLE_DEVICES to every rank unchanged (isolation)."""
    from labkit.launchers.supervisor import child_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert child_env()["CUDA_VISIBLE_DEVICES"] == "4,5"


def test_physical_gpu_maps_local_rank_through_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 5")
    assert [devices.physical_gpu(r) for r in (0, 1, 2)] == ["4", "5", "2"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert devices.physical_gpu(3) == "3"


# ---- claiming a GPU inside a rank -------------------------------------------------------
class FakeCuda:
    """Just enough of ``torch.cuda``: a GPU clock in ms, events, and optional failures."""

    def __init__(self, count: int = 2, busy: set[int] | None = None):
        self.count, self.busy = count, busy or set()
        self.gpu_ms = 1000.0
        self.current: int | None = None
        self.syncs = 0
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                assert enable_timing, "CudaTracer must ask for timing events"
                self.t: float | None = None

            def record(self) -> None:
                self.t = cuda.gpu_ms

            def elapsed_time(self, end: Event) -> float:
                assert self.t is not None and end.t is not None
                return end.t - self.t

        self.Event = Event

    def device_count(self) -> int:
        return self.count

    def set_device(self, i: int) -> None:
        self.current = i

    def mem_get_info(self, i: int) -> tuple[int, int]:
        if i in self.busy:
            raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable\n"
                               "CUDA kernel errors might be asynchronously reported")
        return (70 << 30, 80 << 30)

    def synchronize(self) -> None:
        self.syncs += 1


def test_claim_gpu_binds_the_rank_to_its_gpu():
    cuda = FakeCuda(count=2)
    assert devices.claim_gpu(1, cuda) == 1 and cuda.current == 1


def test_claim_gpu_with_too_few_gpus_says_how_many_are_visible(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(devices.GpuUnavailable) as err:
        devices.claim_gpu(1, FakeCuda(count=1))
    msg = str(err.value)
    assert "cuda:1" in msg and "only 1 GPU(s)" in msg and "CUDA_VISIBLE_DEVICES=0" in msg


def test_claim_gpu_on_a_busy_gpu_names_it_and_the_way_out(monkeypatch):
    """A GPU held by another process (exclusive mode) -> one readable GpuUnavailable."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    with pytest.raises(devices.GpuUnavailable) as err:
        devices.claim_gpu(1, FakeCuda(count=2, busy={1}))
    msg = str(err.value)
    assert "physical GPU 7" in msg and "busy or unavailable" in msg and "nvidia-smi" in msg
    assert "asynchronously" not in msg, "only the first line of the CUDA error is kept"


# ---- CUDA event timing ------------------------------------------------------------------
def test_cuda_tracer_converts_event_times_to_host_nanoseconds():
    """Span edges are CUDA events; after alignment, start = GPU ms since align x 1e6 + offset."""
    from labkit.trace.tracer import CudaTracer

    cuda = FakeCuda()
    tracer = CudaTracer(rank=3, torch_cuda=cuda)
    cuda.gpu_ms += 1.25  # 1.25 ms of GPU work queued before the span
    syncs_before = cuda.syncs
    with tracer.span(Op.FORWARD, step=0, microbatch=1):
        cuda.gpu_ms += 2.5
    start = tracer.now()
    cuda.gpu_ms += 0.75
    tracer.record(Op.ALL_REDUCE, start, tracer.now(), step=0, bytes=4096)
    assert cuda.syncs == syncs_before, "recording spans must not synchronise the GPU"
    fwd, ar = tracer.events(offset_ns=500)
    assert cuda.syncs == syncs_before + 1, "events() synchronises exactly once"
    assert (fwd.rank, fwd.op, fwd.lane, fwd.microbatch) == (3, Op.FORWARD, Lane.COMPUTE, 1)
    assert fwd.start_ns == pytest.approx(1_250_000 + 500, abs=2)
    assert fwd.dur_ns == pytest.approx(2_500_000, abs=2)
    assert ar.lane == Lane.COMM and ar.bytes == 4096
    assert ar.start_ns == pytest.approx(3_750_000 + 500, abs=2)
    assert ar.dur_ns == pytest.approx(750_000, abs=2)


def test_cuda_tracer_realign_moves_time_zero():
    """align() (called after the barrier) makes that GPU instant time zero."""
    from labkit.trace.tracer import CudaTracer

    cuda = FakeCuda()
    tracer = CudaTracer(rank=0, torch_cuda=cuda)
    cuda.gpu_ms += 40.0
    tracer.align()
    with tracer.span(Op.BACKWARD, step=1):
        cuda.gpu_ms += 1.0
    (ev,) = tracer.events()
    assert ev.start_ns == pytest.approx(0, abs=2) and ev.dur_ns == pytest.approx(1e6, abs=2)


# ---- the torchrun worker picks the backend per node --------------------------------------
def test_worker_auto_backend_counts_this_nodes_gpus(monkeypatch):
    from labkit.launchers.torchrun import resolve_backend

    monkeypatch.setattr(devices, "gpu_count", lambda: 4)
    assert resolve_backend("auto", 4) == "nccl"  # 2 nodes x 4 GPUs: 4 per node is enough
    assert resolve_backend("auto", 8) == "gloo"
    assert resolve_backend("gloo", 4) == "gloo"


def test_worker_nccl_with_too_few_local_gpus_names_the_node_setting(monkeypatch):
    from labkit.launchers.torchrun import resolve_backend

    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError) as err:
        resolve_backend("nccl", 4)
    msg = str(err.value)
    assert "--nproc-per-node (4)" in msg and "(2, CUDA_VISIBLE_DEVICES=0,1)" in msg


# ---- real GPUs ----------------------------------------------------------------------------
def _real_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.distributed
@pytest.mark.skipif(_real_gpus() < 1, reason="needs a CUDA GPU (NCCL and CUDA events)")
def test_real_nccl_run_uses_cuda_events():
    """On a GPU machine: auto picks nccl, training runs, spans come from CUDA events."""
    n = min(_real_gpus(), 2)
    run = importlib.import_module("labkit.api").run
    result = run(strategy="ddp", world_size=n, steps=4, timeout_s=180, progress=False)
    assert result.backend == "nccl"
    assert result.params_sha256 and len(result.losses) == 4
    assert result.metrics["compute_s"] > 0
