"""The same strategy code under torchrun: one node (``--standalone``) and two "nodes".

Two nodes are two torchrun agents on this host meeting through a c10d rendezvous on a free
port, one process each. Every test checks the result against ``labkit.run`` of the same
config (identical final-parameter hash, same losses) and that rank 0's merged timeline
holds events from the ranks of every agent. Agents run in their own process groups and are
killed (the whole group) when a test fails or times out, so nothing is left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Op

pytestmark = [pytest.mark.lesson00]

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
STEPS = 5
FLAGS = ["run", "ddp", "--steps", str(STEPS), "--threads-per-rank", "1", "--json"]
AGENT_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _run_agents(commands: list[list[str]]) -> list[tuple[int, str, str]]:
    """Start every agent, wait for all (under a timeout), kill all their processes on failure."""
    # the agents' torchelastic_* dirs go to a private TMPDIR, removed below, not to /tmp
    tmp = tempfile.mkdtemp(prefix="labkit-torchrun-test-")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env={**_env(), "TMPDIR": tmp},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
             for cmd in commands]
    results: list[tuple[int, str, str]] = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=AGENT_TIMEOUT_S)
            results.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _result_json(results: list[tuple[int, str, str]]) -> dict:
    """The one JSON line rank 0 printed (whichever agent rank 0 landed on)."""
    lines = [line for _, out, _ in results for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"expected one JSON result line from rank 0, got {len(lines)}: " + \
        "\n".join(f"--- agent {i} rc={rc}\n{out}\n{err[-3000:]}"
                  for i, (rc, out, err) in enumerate(results))
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def reference():
    """``labkit run`` (the supervisor) on the same config: what torchrun must reproduce."""
    from labkit.api import run

    return run(strategy="ddp", world_size=2, steps=STEPS, threads_per_rank=1,
                      timeout_s=90, progress=False)


def _check_same_training(data: dict, reference) -> None:
    assert data["launcher"] == "torchrun"
    assert data["world_size"] == 2 and data["backend"] == "gloo"
    assert data["params_sha256"] == reference.params_sha256, (
        f"final parameters differ from labkit run: torchrun {data['params_sha256']} vs "
        f"labkit run {reference.params_sha256}")
    assert data["losses"] == pytest.approx(reference.losses, abs=1e-6), "per-step losses differ"


def _check_timeline(path: Path, world_size: int) -> None:
    """Every rank has compute, comm and STEP spans, and the ranks' clocks are aligned: a DDP
    step cannot end on one rank before it started on another (its all-reduce needs both),
    so each step's spans overlap across ranks, up to half a step of alignment error. A
    check of order, not of seconds: a busy machine makes steps slower, not unaligned."""
    tl = Timeline.load(path)
    assert sorted(tl.ranks) == list(range(world_size))
    steps: dict[int, dict[int, tuple[int, int]]] = {}
    for rank in range(world_size):
        ops = {e.op for e in tl.events if e.rank == rank}
        assert Op.STEP in ops and Op.ALL_REDUCE in ops, f"rank {rank}: ops recorded {ops}"
        for e in tl.events:
            if e.rank == rank and e.op == Op.STEP and e.step is not None:
                steps.setdefault(e.step, {})[rank] = (e.start_ns, e.end_ns)
    for step, spans in steps.items():
        assert sorted(spans) == list(range(world_size)), f"step {step}: ranks {sorted(spans)}"
        slack = 0.5 * max(end - start for start, end in spans.values())
        for a, (_, end_a) in spans.items():
            for b, (start_b, _) in spans.items():
                assert start_b <= end_a + slack, (
                    f"step {step}: rank {b} starts {(start_b - end_a) / 1e6:.1f} ms after "
                    f"rank {a} ended it: clocks not aligned")


@pytest.mark.distributed
def test_two_torchrun_agents_train_like_labkit_run(tmp_path: Path, reference) -> None:
    """Two agents (nnodes=2, c10d) train ddp; rank 0 gathers both nodes' ranks into one timeline."""
    port = _free_port()
    timeline = tmp_path / "timeline.json"
    trace = tmp_path / "trace.json"
    commands = [TORCHRUN + ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                            "--rdzv-conf", "timeout=60", "--max-restarts", "0",
                            "-m", "labkit.worker", *FLAGS, "--timeline", str(timeline),
                            "--trace", str(trace)]
                for node in (0, 1)]
    results = _run_agents(commands)
    for i, (rc, _, err) in enumerate(results):
        assert rc == 0, f"agent {i} exited with {rc}:\n{err[-3000:]}"
    data = _result_json(results)
    _check_same_training(data, reference)
    assert data["nnodes"] == 2
    nodes = {row["node_rank"]: row for row in data["ranks"]}
    assert sorted(nodes) == [0, 1], f"ranks came from agents {sorted(nodes)}, want [0, 1]"
    assert all(row["events"] > 0 for row in data["ranks"]), data["ranks"]
    assert len({row["pid"] for row in data["ranks"]}) == 2
    _check_timeline(timeline, 2)
    pids = {e["pid"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"}
    assert pids == {0, 1}, f"Chrome trace rows {pids}, want one per rank"


@pytest.mark.distributed
def test_torchrun_standalone_matches_labkit_run(tmp_path: Path, reference) -> None:
    """``torchrun --standalone --nproc-per-node 2 -m labkit.worker`` == ``labkit run``."""
    timeline = tmp_path / "timeline.json"
    results = _run_agents([TORCHRUN + ["--standalone", "--nproc-per-node", "2",
                                       "--max-restarts", "0", "-m", "labkit.worker", *FLAGS,
                                       "--timeline", str(timeline)]])
    assert results[0][0] == 0, results[0][2][-3000:]
    data = _result_json(results)
    _check_same_training(data, reference)
    assert [row["rank"] for row in data["ranks"]] == [0, 1]
    assert {row["clock"] for row in data["ranks"]} == {"same host as rank 0"}
    _check_timeline(timeline, 2)


@pytest.mark.distributed
def test_torchrun_failure_names_the_rank() -> None:
    """A rank that raises makes torchrun exit non-zero, and its error JSON names it."""
    results = _run_agents([TORCHRUN + ["--standalone", "--nproc-per-node", "2",
                                       "--max-restarts", "0", "-m", "labkit.worker", "run", "ddp",
                                       "--steps", "4", "--json", "--timeout", "60",
                                       "--inject-fault", "1:2:raise"]])
    rc, out, err = results[0]
    assert rc != 0
    errors = [json.loads(line)["error"] for line in out.splitlines() if line.startswith("{")]
    assert any(e["rank"] == 1 and "injected fault" in e["message"] for e in errors), out + err


def test_worker_outside_torchrun_explains_how_to_start_it() -> None:
    """Without torchrun's environment the worker exits 2 with a torchrun example."""
    env = {k: v for k, v in _env().items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run([sys.executable, "-m", "labkit.worker", "run", "ddp"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2
    assert "torchrun --standalone --nproc-per-node" in p.stderr
