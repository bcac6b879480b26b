"""The GPU code paths, covered on a CPU-only machine with mocks.

``labkit.base.devices.gpu_count`` is monkeypatched to pretend GPUs exist, and a fake
``torch.cuda`` (Event / synchronize / set_device / mem_get_info) stands in for CUDA, so
these tests pin down: ``backend="auto"`` picks NCCL with one GPU per rank (and gloo with
too few), explicit ``nccl`` with too few GPUs or a busy GPU fails with a clear message,
``CUDA_VISIBLE_DEVICES`` is honoured end to end, and ``CudaTracer`` turns CUDA event times
into nanoseconds on the host clock correctly. The self-test's GPU paths too
(``labkit doctor --selftest``): its in-rank matmul and allocator readings on mocked CUDA, and
its whole table on recorded, GPU-like numbers from a stand-in NCCL pool (fixtures, not
results). Only the test marked ``distributed`` at the end of the CUDA section needs real GPUs.
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


# ---- the self-test's GPU rows, on mocked CUDA and recorded GPU-like numbers -----------------------
# Everything below is a FIXTURE shaped like an NCCL run on two H100s (numbers written for the
# tests, not measured); docs/benchmarks.md holds real GPU numbers with the device named.
class _CpuCtx:
    """A rank context whose 'GPU' is the CPU, for the in-rank functions under mocked CUDA."""

    def __init__(self):
        import torch

        self.device = torch.device("cpu")


def _mock_cuda(monkeypatch):
    import time

    import torch

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing, "the self-test times with timing events"
            self.t = None

        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    alloc = {"now": 5 * 2**20, "peak": 9 * 2**20}
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: alloc["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: alloc["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: alloc.update(peak=alloc["now"]))
    return alloc


def test_selftest_matmul_times_the_same_work_with_events_and_the_host_clock(monkeypatch):
    """FLOP/s = 2 n^3 x count / event time; both clocks see the same loop."""
    from labkit.selftest.gpu import matmul_on_rank

    _mock_cuda(monkeypatch)
    got = matmul_on_rank(_CpuCtx(), "fp32", 64, seconds=0.02)
    assert got["count"] >= 10 and got["name"] == "NVIDIA H100 80GB HBM3"
    assert got["flops"] == pytest.approx(2 * 64**3 * got["count"] / got["event_s"])
    assert got["event_s"] <= got["host_s"] and got["host_s"] - got["event_s"] < 0.05


def test_selftest_reads_the_allocator_peak_after_resetting_it(monkeypatch):
    from labkit.selftest.gpu import peak_on_rank, reset_peak_on_rank

    alloc = _mock_cuda(monkeypatch)
    assert reset_peak_on_rank(_CpuCtx()) == 5 * 2**20 and alloc["peak"] == 5 * 2**20
    alloc["peak"] = 700 * 2**20
    assert peak_on_rank(_CpuCtx()) == 700 * 2**20


class _FakeNcclPool:
    """Answers like a 2-GPU NCCL pool with FIXTURE metrics consistent with each config."""

    MiB = 2**20

    def __init__(self, overhead_mib: int = 80, world_size: int = 2, backend: str = "nccl"):
        self.overhead = overhead_mib * self.MiB
        self.world_size, self.backend = world_size, backend
        self.last: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, **kw):
        from types import SimpleNamespace

        from labkit.launchers.pool import pool_problems
        from labkit.selftest.judge import paper_zero_bytes

        n = self.world_size
        cfg = RunConfig(**kw)
        if pool_problems(cfg, n, self.backend):  # what a real pool refuses (the H200's run)
            raise ConfigError(pool_problems(cfg, n, self.backend))
        o, m, b = cfg.options, cfg.model, cfg.batch_size
        metrics = {
            "ddp": lambda: {"max_abs_diff_vs_reference": 3e-6} if cfg.check_reference else
            self._gpt(m, b * n) if m.kind == "gpt" else {
                "mfu": 0.55, "peak_flops_per_s": 100e12, "flops_per_step": 6 * (
                    m.in_dim * m.width + (m.depth - 1) * m.width**2 + m.width * m.out_dim) * 2 * b},
            "allreduce-bench": lambda: {"results": [{"time_s": t, "busbw_gbps":
                                                     o.sizes[0] / t / 1e9 * 2 * (n - 1) / n}
                                                    for t in [2.6e-3 if o.impl == "ring" else 1.9e-3]]},
            "ddp-bucketed": lambda: {"overlap_fraction": 0.62, "buckets": 19},
            "pipeline": lambda: {"microbatches": o.microbatches, "bubble_fraction": 0.215,
                                 "bubble_fraction_predicted": 0.2},
            "tp": lambda: {"comm_bytes_per_layer_measured": [
                {"forward": 2 * b * o.seq * o.hidden * 4, "backward": 2 * b * o.seq * o.hidden * 4}
            ] * o.layers},
            "zero": lambda: self._zero(paper_zero_bytes(m.parameters(), n, o.stage, o.precision),
                                       b, o.precision),
        }[cfg.strategy]()
        self.last, self.model, self.batch = metrics, m, b
        return SimpleNamespace(config=cfg, metrics=metrics, backend=self.backend)

    def _zero(self, paper, batch, precision):
        states, n = {k: int(v) for k, v in paper.items()}, self.world_size
        return {"precision": precision, "per_rank_bytes": [states] * n,
                "peak_model_state_bytes": [sum(states.values()) + 128 * self.MiB] * n,
                "saved_activation_bytes": [batch * 4096 * 4 * 8] * n}

    @staticmethod
    def _gpt(m, samples):
        from labkit.theory import training_flops

        weights = 12 * m.depth * m.width**2 + 96 * m.width
        return {"mfu": 0.45, "peak_flops_per_s": 700e12, "peak_source": "bf16 torch.mm",
                "flops_per_step": training_flops(weights, samples, seq=m.seq_len,
                                                 attention_layers=m.depth, hidden=m.width)}

    def launch(self, fn, *args, **kw):
        from types import SimpleNamespace

        base = 512 * self.MiB
        n = self.world_size
        if fn.__name__ == "whoami":
            out = [{"rank": r, "world_size": n, "pid": 100 + r, "device": f"cuda:{r}"}
                   for r in range(n)]
        elif fn.__name__ == "reset_peak_on_rank":
            out = [base] * n
        elif fn.__name__ == "peak_on_rank":
            from labkit.selftest.gpu import zero_phases

            m, states = self.last, sum(self.last["per_rank_bytes"][0].values())
            phases = zero_phases(self.model, self.batch, m["peak_model_state_bytes"][0] - states,
                                 m["saved_activation_bytes"][0],
                                 2 if m["precision"] == "bf16" else 4)
            out = [base + states + int(max(phases.values())) + self.overhead] * n
        else:  # matmul_on_rank(dtype, n)
            flops = 52e12 if args[0] == "fp32" else 720e12
            out = [{"flops": flops, "event_s": 0.5, "host_s": 0.503, "count": 200,
                    "name": "NVIDIA H100 80GB HBM3", "allow_tf32": False}] * n
        return SimpleNamespace(results=out)


def _gpu_rows(monkeypatch, pool):
    from labkit.analysis import calibrate
    from labkit.selftest import checks, gpu
    from labkit.selftest.sizes import gpu_sizes

    monkeypatch.setattr(devices, "gpu_count", lambda: 2)
    monkeypatch.setattr(calibrate, "calibrate", lambda device="cpu", **kw: {
        "peak_flops_per_s": 50e12, "matrix": 1024, "measured_at": 0.0})
    bench = checks.Bench(pool, gpu_sizes(50e12), gpus=2)
    rows = [row for check in checks.RANK_CHECKS for row in check(bench)]
    return rows + gpu.device_rows(pool, 2)


def test_selftest_table_on_recorded_nccl_numbers_runs_every_gpu_row(monkeypatch):
    """On NCCL the ZeRO rows add max_memory_allocated against the prediction, and the GPU's
    own rows (datasheet fp32 / bf16, CUDA events) run instead of saying 'skipped'."""
    rows = {r.key: r for r in _gpu_rows(monkeypatch, _FakeNcclPool())}
    assert [k for k, r in rows.items() if r.status != "pass"] == []
    assert {"zero_1_gpu_memory", "zero_2_gpu_memory", "zero_3_gpu_memory",
            "zero_2_bf16_gpu_memory", "zero_2_bf16_bytes"} <= set(rows)
    mem = rows["zero_2_gpu_memory"]
    assert mem.backend == "nccl" and mem.values["overhead"] == 80 * 2**20
    assert "512-byte rounding" in mem.note
    assert rows["datasheet_bf16"].values["model"] == "H100 SXM"
    assert rows["datasheet_fp32"].off_by == "78% of the datasheet"
    assert rows["cuda_events"].status == "pass" and rows["ranks"].backend == "nccl"
    assert rows["ring_busbw"].measured.startswith("98.5 vs 135 GB/s")


def test_selftest_table_fails_the_memory_row_when_the_gpu_holds_far_more(monkeypatch):
    """A stage-3 run that never freed its gathered layers would look like this: FAIL, by how much."""
    rows = {r.key: r for r in _gpu_rows(monkeypatch, _FakeNcclPool(overhead_mib=4000))}
    mem = rows["zero_3_gpu_memory"]
    assert mem.status == "fail" and "more than the allocator" in mem.note
    assert mem.off_by.startswith("+4000 MiB")


# ---- torch releases older than the CPU pin (a GPU image's own torch) ---------------------
def test_one_tensor_collectives_fall_back_to_the_older_spelling():
    """torch 2.13 spells them reduce_scatter_single / all_gather_single; 2.4-2.12 only
    reduce_scatter_tensor / all_gather_into_tensor. The H200's image had torch 2.11, where
    ZeRO and TP died with "module 'torch.distributed' has no attribute
    'reduce_scatter_single'": both spellings must resolve, the new one first."""
    from types import SimpleNamespace

    from labkit.trace.comm import tensor_collective

    def old_rs(o, i, op=None, group=None, async_op=False):
        return "tensor"

    def new_rs(o, i, op=None, group=None, async_op=False):
        return "single"

    older = SimpleNamespace(reduce_scatter_tensor=old_rs, all_gather_into_tensor=old_rs)
    assert tensor_collective("reduce_scatter", older) is old_rs
    assert tensor_collective("all_gather", older) is old_rs
    both = SimpleNamespace(reduce_scatter_single=new_rs, reduce_scatter_tensor=old_rs)
    assert tensor_collective("reduce_scatter", both) is new_rs
    with pytest.raises(RuntimeError, match="reduce_scatter_single / reduce_scatter_tensor"):
        tensor_collective("reduce_scatter", SimpleNamespace())


def test_selftest_with_one_gpu_runs_every_row_one_gpu_can(monkeypatch):
    """One GPU, two ranks (the H200 lent here): NCCL refuses two ranks on one device, so the
    rank rows run on gloo and say why, and the rows one GPU can run do run on a one-rank NCCL
    pool -- ZeRO's allocator peak at N_d = 1 and a bf16 GPT's MFU -- instead of being
    skipped (before, the table skipped every max_memory_allocated row and had no GPU MFU)."""
    from labkit.analysis import calibrate
    from labkit.selftest import gpu, runner

    pools = []

    def fake_pool(world_size, backend="auto"):
        pools.append(_FakeNcclPool(world_size=world_size, backend=backend))
        return pools[-1]

    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    monkeypatch.setattr(runner, "Pool", fake_pool)
    monkeypatch.setattr(runner, "_gpu_peak", lambda: 50e12)
    monkeypatch.setattr(gpu, "gpu_names", lambda: [{"index": 0, "name": "NVIDIA H200"}])
    monkeypatch.setattr(gpu, "nvidia_smi_topo", lambda: "\tGPU0\tCPU Affinity\nGPU0\t X \t0-15\n")
    monkeypatch.setattr(calibrate, "calibrate", lambda device="cpu", **kw: {
        "peak_flops_per_s": 700e12 if kw.get("dtype") == "bf16" else 50e12, "measured_at": 0.0})
    started: list[str] = []
    report = runner.run_selftest(on_start=started.append)
    # the GPU's sizing calibration (87 s on a fresh H200, silent before) is announced first
    assert started[0] == runner.SIZING and "calibrate --device cuda" in started[0]
    rows = {r.key: r for r in report.rows}
    assert [(p.world_size, p.backend) for p in pools] == [(2, "gloo"), (1, "nccl")]
    assert [k for k, r in rows.items() if r.status != "pass"] == [], report.markdown()
    for key in ("ranks", "ddp_reference", "zero_2_bytes"):
        assert rows[key].backend == "gloo" and "NCCL needs one GPU per rank, 1 visible" in rows[key].note
    for key in ("zero_1_gpu_memory", "zero_2_gpu_memory", "zero_3_gpu_memory",
                "zero_2_bf16_gpu_memory"):
        assert rows[key].backend == "nccl" and rows[key].check.endswith("one GPU, N_d = 1")
    mfu = rows["gpt_mfu_bf16"]
    assert mfu.measured == "MFU 0.45" and "700 TFLOP/s" in mfu.expected
    assert report.count("skipped") == 0


def test_gpt_mfu_row_fails_when_the_flops_are_not_palms_count():
    """The GPU's MFU row checks the run's FLOPs against PaLM's (6 N + 12 L h s) x tokens."""
    from labkit.selftest.judge_devices import gpt_mfu

    h, layers, seq, samples = 2048, 4, 512, 32
    weights = 12 * layers * h * h + 96 * h
    paper = 6 * weights * samples * seq + 12 * layers * h * seq * samples * seq
    good = gpt_mfu(0.4, paper, weights, layers, h, seq, samples, 700e12, "bf16 torch.mm")
    assert good.status == "pass" and good.off_by == "model work 280 TFLOP/s"
    wrong = gpt_mfu(0.4, 6 * weights * samples * seq, weights, layers, h, seq, samples, 700e12, "x")
    assert wrong.status == "fail" and "PaLM" in wrong.note
    none = gpt_mfu(None, paper, weights, layers, h, seq, samples, None, "?", "too busy")
    assert none.status == "fail" and none.note == "too busy"


FACTORIES = {"zeros", "empty", "ones", "full", "randn", "rand", "arange", "tensor"}
AUTOGRAD_MODULES = ("labkit/train/parallel/zero_units.py", "labkit/train/parallel/zero.py",
                    "labkit/train/parallel/tensor.py", "labkit/train/parallel/experts.py",
                    "labkit/train/parallel/ring_attention.py",
                    "labkit/train/parallel/attention_blocks.py")
"""Rank code whose functions run inside backward (ZeRO's, TP's, EP's and ring attention's
autograd Functions and hooks): on a GPU those run on autograd's device thread."""


@pytest.mark.parametrize("path", AUTOGRAD_MODULES)
def test_buffers_made_in_backward_name_their_device(path):
    """``torch.set_default_device`` is thread-local, and on a GPU autograd runs backward on a
    thread of its own, where a bare ``torch.zeros(n)`` lands on the CPU: on the H200 every
    ZeRO run on NCCL died with "CUDAGuardImpl initialized with non-CUDA DeviceType: cpu".
    So every tensor factory in code that backward calls names its device."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / path).read_text())
    bare = [f"line {node.lineno}: torch.{node.func.attr}(...)" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and not any(k.arg == "device" for k in node.keywords)]
    assert not bare, f"{path}: tensors made without device=: {bare}"


def test_powersgd_on_cpu_ranks_of_a_gpu_machine_sees_no_cuda(monkeypatch):
    """torch's PowerSGD hook calls torch.cuda.synchronize(bucket device) whenever CUDA is
    available: lesson 06's gloo (CPU) PowerSGD run died on the H200 with "Expected a cuda
    device, but got: cpu". On CPU ranks the hook's ``torch`` reports no CUDA, everything else
    passes through, and the module is restored afterwards."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from labkit.strategies.compression.hooks import traced_torch_hooks
    from labkit.strategies.ddp.torch_ddp import StepRef

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    with traced_torch_hooks(object(), StepRef(), on_cpu=True):
        assert powerSGD_hook.torch.cuda.is_available() is False
        assert powerSGD_hook.torch.zeros is torch.zeros
    assert powerSGD_hook.torch is torch
    with traced_torch_hooks(object(), StepRef(), on_cpu=False):  # GPU ranks keep CUDA
        assert powerSGD_hook.torch.cuda.is_available() is True


@pytest.fixture
def meta_default_device():
    """The default device of a ZeRO rank on a GPU (``set_default_device(cuda)``), with the
    meta device standing in for the GPU: whatever lands there was made without a device."""
    import torch

    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("kind", ["gpt", "mlp", "digits"])
def test_the_data_is_made_on_the_cpu_whatever_the_default_device(meta_default_device, kind):
    """On the H200 every ZeRO run of the GPT died checking its reference: the ZeRO rank makes
    its GPU the default device, the text data (``torch.tensor(ids)``, ``torch.arange``) was
    made there, and the one-process reference on the CPU read it ("index is on cuda:0,
    different from other tensors on cpu"). The data is made on the CPU; the loop moves each
    batch to the rank's device."""
    from labkit.train.data import text
    from labkit.train.models import task_for

    text.tokens.cache_clear()  # the corpus is cached: make it again under this default device
    try:
        config = RunConfig(strategy="ddp", model=kind, steps=1)
        x, y = task_for(config).batch(0, 4)
        assert (x.device.type, y.device.type) == ("cpu", "cpu"), kind
    finally:
        text.tokens.cache_clear()


class _OneRankComm:
    """A data-parallel group of one for ``ShardedModel`` outside a run (nothing to send)."""

    world_size, rank = 1, 0

    class tracer:  # the attribute the units record their spans on
        @staticmethod
        def detail(*_a, **_k):
            import contextlib

            return contextlib.nullcontext()


def test_sharded_units_keep_their_buffers_on_the_device_they_are_given():
    """The hybrid engine (pipeline, 3D, MoE on one GPU) moved its stage to the GPU and then
    sharded it with the CPU as the default device: every unit's buffers stayed on the CPU
    and the first forward on the H200 failed. ``ShardedModel(device=...)`` names the device;
    here the meta device stands in for the GPU, the default device staying the CPU."""
    import torch

    from labkit.train.models.gpt import build_gpt
    from labkit.train.parallel.zero import ShardedModel

    gpt = build_gpt(64, 32, 2, 4, 16, seed=0).to("meta")
    for stage in (0, 1, 2, 3):
        sharded = ShardedModel(gpt if stage == 0 else build_gpt(64, 32, 2, 4, 16, 0).to("meta"),
                               stage=stage, comm=_OneRankComm(), device="meta")
        held = [t for u in sharded.units for t in (u.full, u.param_shard, u.grad, u.master)
                if isinstance(t, torch.Tensor)]
        assert held and {t.device.type for t in held} == {"meta"}, stage
        if stage < 3:  # stages 0-2 hold the parameters whole: run the forward on them
            out = sharded(torch.zeros(2, 16, dtype=torch.long, device="meta"))
            assert out.device.type == "meta" and out.shape == (2, 16, 64)


@pytest.mark.parametrize("path", ["labkit/strategies/zero/impl.py",
                                  "labkit/strategies/hybrid/impl.py"])
def test_rank_code_shards_its_model_on_the_ranks_device(path):
    """Every ``ShardedModel`` a strategy builds names the rank's device (see above)."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / path).read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "ShardedModel"]
    assert calls, f"{path} builds no ShardedModel"
    for call in calls:
        device = [k.value for k in call.keywords if k.arg == "device"]
        assert device and ast.unparse(device[0]) == "ctx.device", (path, call.lineno)
