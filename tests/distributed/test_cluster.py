"""Emulated nodes for real: namespaces, a shaped link, torchrun across it, nothing left behind.

Pins down the issue's "done when": the all-reduce bench reports the link it ran over (shaped
rate and measured goodput within 10%, busbw no higher than the link carries); a 2-node DDP
run returns a timeline with ranks of both nodes and trains exactly like ``labkit.run`` on
one node; failed (raise, kill), hung (timeout) and interrupted runs, and two runs at once,
leave no labkit namespace, interface or process. Skipped, with the reason, where this
machine cannot create namespaces (CI runs as root). Timings are checked in bench/.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from labkit.base.errors import RunFailed, RunTimeout
from labkit.base.events import Op
from labkit.base.netsupport import support
from labkit.launchers.cluster import leftovers as lo

pytestmark = [pytest.mark.distributed, pytest.mark.lesson10]
ROOT = Path(__file__).resolve().parents[2]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (CI runs as root) to create and inspect labkit network namespaces"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    where = support()
    return None if where.mode == "root" else where.reason


needs_root = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def _leftovers() -> list[str]:
    """Every trace of a labkit cluster run on this host: namespaces, host interfaces, processes."""
    found = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                         text=True, check=False).stdout.split()
             if ns.startswith("labkit-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                           check=False).stdout
    found += [line.split(":")[1].strip() for line in links.splitlines() if "labkit" in line]
    found += [f"pid {pid} (run {rid})" for pid, rid, _ in lo.run_processes()]
    found += [d.name for d in Path(tempfile.gettempdir()).glob("labkit-cluster-?????-*")]
    return found


_BEFORE: set[str] = set()  # what was on this host before the running test began


@pytest.fixture(autouse=True)
def _traces_before_the_test() -> None:
    """Another session's (or a killed run's) namespace is not this test's leftover: each
    test answers only for what appeared while it ran."""
    _BEFORE.clear()
    _BEFORE.update(_leftovers())


def assert_nothing_left(timeout_s: float = 10.0) -> None:
    """Namespaces, links and processes are gone (processes may take a moment to be reaped)."""
    deadline = time.monotonic() + timeout_s
    while (left := sorted(set(_leftovers()) - _BEFORE)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left behind: {left}"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labkit.cli", "run", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@needs_root
def test_allreduce_bench_reports_the_link_and_stays_under_it() -> None:
    """Done when #1: metrics.link has rate_bps and measured_bps within 10%, busbw <= link."""
    import json

    p = subprocess.run(_cli("allreduce-bench", "--nodes", "2", "--world-size", "2", "--link",
                            "200mbit", "--impl", "builtin", "--sizes", "4MB", "--iters", "4",
                            "--json"), capture_output=True, text=True, timeout=180, env=_env(),
                       cwd=ROOT, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    link = data["metrics"]["link"]
    assert link["rate_bps"] == 200e6
    assert abs(link["measured_bps"] / link["rate_bps"] - 1) <= 0.10, link
    busbw = data["metrics"]["results"][0]["busbw_gbps"] * 1e9
    # 2% for the token bucket's initial burst (about 100 KB against 24 MB timed)
    assert busbw <= link["max_busbw_Bps"] * 1.02, (busbw, link)
    assert data["metrics"]["node_of_rank"] == [0, 1]
    assert data["config"]["nodes"] == 2 and data["config"]["link"] == "200mbit"
    assert_nothing_left()


@needs_root
def test_ddp_on_two_nodes_trains_like_one_node_with_both_nodes_on_the_timeline() -> None:
    """Done when #2: 4 ranks on 2 nodes: every rank of both nodes on the timeline, the same
    weights as labkit.run on one node; in the same job, the hierarchical all-reduce runs its
    cross-node step on groups that span the nodes (one rank per node)."""
    import labkit
    from labkit.launchers.cluster.launcher import run_many

    common = dict(world_size=4, steps=3, threads_per_rank=1, timeout_s=150, progress=False)
    reference = labkit.run(strategy="ddp", **common)
    ddp, hier = run_many([
        labkit.RunConfig(strategy="ddp", nodes=2, link="infiniband_hdr", **common),
        labkit.RunConfig(strategy="allreduce-bench", nodes=2, link="infiniband_hdr",
                         options={"impl": "hierarchical", "sizes": ("40KB",), "iters": 2},
                         **{**common, "steps": 1})])
    assert ddp.params_sha256 == reference.params_sha256
    assert ddp.losses == pytest.approx(reference.losses, abs=1e-6)
    tl = ddp.timeline
    assert sorted(tl.ranks) == [0, 1, 2, 3]
    assert sorted(ddp.metrics["node_of_rank"]) == [0, 0, 1, 1]
    for rank in range(4):
        assert any(e.rank == rank and e.op == Op.ALL_REDUCE for e in tl.events), rank
    assert ddp.metrics["link"]["preset"] == "infiniband_hdr"
    assert hier.metrics["ranks_per_node"] == 2
    inter = [e for e in hier.timeline.events if e.axis == "inter" and e.op == Op.ALL_REDUCE]
    intra = [e for e in hier.timeline.events if e.axis == "intra"]
    assert inter and intra
    assert {e.bytes for e in inter} == {20_000}  # each local rank's half of 40 KB
    assert_nothing_left()


@needs_root
def test_a_cluster_run_leaves_nothing_in_the_callers_temp_dir(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Issue 25: torchrun's ``torchelastic_*`` dirs and torch's ``torchinductor_<user>``
    cache used to pile up in $TMPDIR, two per run; the agents' TMPDIR is the run's own
    directory now, removed with it."""
    import labkit

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = labkit.run(strategy="ddp", world_size=2, nodes=2, steps=2, threads_per_rank=1,
                     timeout_s=150, progress=False)
    assert res.params_sha256
    assert sorted(os.listdir(tmp_path)) == [], "the cluster run left files in TMPDIR"
    assert_nothing_left()


@needs_root
@pytest.mark.parametrize("fault, kind", [("1:1:raise", "exception"), ("1:1:kill", "signal")])
def test_a_failing_rank_is_named_and_nothing_is_left(fault: str, kind: str) -> None:
    """--inject-fault across nodes: RunFailed names rank 1 and how it failed, keeps what the
    ranks recorded before it (err.timeline), and the network is torn down."""
    import labkit

    with pytest.raises(RunFailed) as err:
        labkit.run(strategy="ddp", world_size=2, nodes=2, link="200mbit", steps=3,
                   inject_fault=fault, timeout_s=120, progress=False)
    assert (err.value.rank, err.value.kind) == (1, kind)
    # the ranks spooled their events: the failed run's timeline ends before the fault
    assert err.value.timeline.finished_steps(1) == [0]
    assert_nothing_left()


@needs_root
def test_a_hung_rank_times_out_named_and_nothing_is_left() -> None:
    """A rank that hangs outside communication is named when the run times out. At step 1,
    the issue's case (36, item 3): there rank 0 waits in the broadcast torch's DDP makes
    itself (its bucket order, outside labkit's comm layer), seen in its stack."""
    import labkit

    with pytest.raises(RunTimeout) as err:
        labkit.run(strategy="ddp", world_size=2, nodes=2, steps=4, inject_fault="1:1:hang",
                   timeout_s=60, progress=False)  # start-up under a loaded suite
    assert err.value.rank == 1, str(err.value)
    assert "rank 1 stopped making progress at step 1 outside any communication call, while " \
        "rank(s) 0 waited for it" in str(err.value)
    assert_nothing_left()


def _wait_for_workers(timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(b"labkit.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
               for pid, _, _ in lo.run_processes() if Path(f"/proc/{pid}").exists()):
            return
        time.sleep(0.2)
    raise AssertionError("the cluster's ranks never started")


@needs_root
def test_ctrl_c_stops_the_run_and_nothing_is_left() -> None:
    """SIGINT to `labkit run --nodes 2` mid-training: exit 130, "stopped by Ctrl-C", teardown."""
    p = subprocess.Popen(_cli("ddp", "--nodes", "2", "--link", "20mbit", "--steps", "100000",
                              "--timeout", "300"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try:
        _wait_for_workers()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=150)  # a loaded suite slows the teardown
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and "stopped by Ctrl-C" in err, err[-2000:]
    assert_nothing_left()


@needs_root
def test_two_runs_at_once_do_not_collide() -> None:
    """Two emulated clusters at the same time: different run ids, both finish, teardown."""
    procs = [subprocess.Popen(_cli("allreduce-bench", "--nodes", "2", "--link", "100mbit",
                                   "--sizes", "100KB", "--iters", "2", "--json"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(), cwd=ROOT) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert_nothing_left()


@needs_root
def test_a_crashed_runs_leftovers_are_swept() -> None:
    """What a killed launcher leaves (a namespace, a process of its run, its run directory,
    no live lock) is removed by the next sweep (every run starts with one; so does `labkit
    doctor --clean`)."""
    run_id = "0dead"
    subprocess.run(["ip", "netns", "add", f"labkit-{run_id}-n0"], check=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"labkit-cluster-{run_id}-"))
    env = {**os.environ, lo.ENV_RUN: run_id, lo.ENV_LOCK: str(lo.lock_path(run_id))}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        p = subprocess.run([sys.executable, "-m", "labkit.cli", "doctor", "--clean"],
                           capture_output=True, text=True, timeout=60, env=_env(), check=False)
        assert p.returncode == 0 and f"labkit-{run_id}-n0" in p.stdout, p.stdout
        assert orphan.wait(10) == -signal.SIGKILL
        assert not run_dir.exists()
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    assert_nothing_left()


def test_a_sweep_kills_processes_of_dead_runs_only(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes carry LABKIT_CLUSTER_RUN; those whose run lock is free are killed."""
    monkeypatch.setattr(lo, "lock_dir", lambda: tmp_path)
    live = lo.new_run()
    env = {**os.environ, lo.ENV_RUN: "00000", lo.ENV_LOCK: str(tmp_path / "00000.lock")}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**env, lo.ENV_RUN: live.run_id, lo.ENV_LOCK: str(live.path)})
    try:
        report = lo.sweep("00000")
        assert orphan.wait(10) != 0 and orphan.pid in report.processes
        assert keeper.poll() is None and keeper.pid not in report.processes
        report = lo.sweep()
        assert keeper.poll() is None and keeper.pid not in report.processes
    finally:
        for p in (orphan, keeper):
            p.kill()
            p.wait()
        live.release()


@pytest.mark.skipif(support().mode is None or shutil.which("ip") is None,
                    reason=f"no emulated nodes here: {support().reason}")
def test_the_unprivileged_path_measures_the_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside `unshare --user --map-root-user --net --mount` (what a non-root student gets)
    the same code shapes and measures the link; its namespaces never show on the host."""
    from labkit.base.netsupport import userns_works
    from labkit.launchers.cluster.launcher import measure_link

    if not userns_works()[0]:
        pytest.skip(f"unprivileged user namespaces: {userns_works()[1]}")
    monkeypatch.setenv("LABKIT_CLUSTER_MODE", "userns")
    link = measure_link("50mbit")
    assert abs(link["measured_bps"] / 50e6 - 1) <= 0.10, link
    if os.geteuid() == 0:
        assert_nothing_left()


def test_hierarchical_allreduce_equals_the_sum() -> None:
    """On 4 ranks as 2 nodes x 2, reduce-scatter / all-reduce / all-gather == all_reduce,
    for sizes that do and do not split evenly over a node."""
    import labkit

    def check(ctx):  # runs on every rank
        import torch

        from labkit.rank.subgroups import build_node_comms
        from labkit.strategies.collectives.hierarchical import hierarchical_allreduce

        intra, inter = build_node_comms(ctx.comm, 2)
        worst = 0.0
        for numel in (1, 5, 1000, 1001):
            x = torch.randn(numel, generator=torch.Generator().manual_seed(ctx.rank + numel))
            expected = x.clone()
            ctx.comm.all_reduce(expected)
            got = hierarchical_allreduce(intra, inter, x.clone())
            worst = max(worst, float((got - expected).abs().max()))
        return worst, intra.ranks, inter.ranks

    out = labkit.launch(check, 4, timeout_s=120)
    for rank, (worst, intra, inter) in enumerate(out.results):
        assert worst <= 1e-5, f"rank {rank}: max |hierarchical - all_reduce| = {worst}"
        assert intra == [rank - rank % 2, rank - rank % 2 + 1]
        assert inter == [rank % 2, rank % 2 + 2]


def test_without_a_cluster_ddp_rows_hold_the_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no namespaces can be made, lesson 10's DDP cell still runs: the one-node rows
    are measured, the cross-node row is the alpha-beta prediction and says so."""
    from labkit.lessons import cluster as ex
    from labkit.visuals import cluster as vc

    monkeypatch.setenv("LABKIT_CLUSTER_MODE", "off")
    ddp = ex.ddp_across_links(("ethernet_25g",), steps=3, batch_size=32)
    one, loop, across = ddp["rows"]
    assert one["step_s"] > 0 and loop["step_s"] > 0 and across["step_s"] is None
    # 833 KB of gradients over 50 Mbit/s: the prediction alone is over 100 ms
    assert across["predicted_comm_s"] > 0.1 and "not measured" in across["note"]
    assert "not measured" in ex.table(ddp["rows"], ["name", "step_s", "predicted_step_s"])
    overhead = ex.overhead_inside_vs_across(ddp)
    assert overhead["measured"] is False and 0 < overhead["across"] < 1
    vc.plot_ddp_links(ddp)
    vc.plot_overhead(overhead)
