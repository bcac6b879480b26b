"""Nothing left (issue 25, item 5), counted by process tree, not by name: each "kernel"
runs as the child of a child subreaper (``conftest.run_in_subreaper``), so whatever it
started -- a daemon that left its process group, its session and every file included --
stays in that tree, and what is still alive there after the kernel is gone is a leftover.

* the textbook daemon (double fork, ``setsid``, close every descriptor) started by a rank
  is gone when ``labkit.launch`` returns, forked or exec'd, run succeeding or failing;
* a warm pool's job child and daemon are gone before the next job, and after the pool's
  kernel is killed with ``kill -9``;
* a kernel interrupted 12 times at random points of its first runs, then running normally,
  leaves no process and no temp dir;
* a run directory a killed kernel could not remove is removed by the next run.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from tests.conftest import run_in_subreaper

pytestmark = [pytest.mark.distributed, pytest.mark.lesson00, pytest.mark.timeout(600)]

DAEMON = '''
def textbook_daemon(ctx, fail=False):
    """Stevens' daemon: fork, setsid, fork again, close every descriptor; returns its pid."""
    import os, time
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, str(os.getpid()).encode().ljust(16))
            os.closerange(0, 65536)  # every descriptor: stdin/out/err, pipes, files
            while True:
                time.sleep(1)
        os._exit(0)
    os.wait()
    pid = int(os.read(read, 16))
    if fail and ctx.rank == 1:
        raise RuntimeError("rank 1 fails after starting its daemon")
    return pid

def alive(pid):
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
'''


@pytest.mark.parametrize("start", ["fork", "exec"])
@pytest.mark.parametrize("fail", [False, True])
def test_a_textbook_daemon_started_by_a_rank_is_gone_when_the_run_ends(start: str,
                                                                       fail: bool) -> None:
    kernel = DAEMON + f'''
import json, os, labkit
from labkit.base.errors import RunFailed
if {start!r} == "exec":
    os.environ["LABKIT_FORKSERVER"] = "0"
pids = []
try:
    pids = labkit.launch(textbook_daemon, 2, {fail!r}, timeout_s=60).results
except RunFailed:
    pass
import glob
pids = pids or []
print(json.dumps({{"pids": pids, "alive": [p for p in pids if alive(p)]}}))
'''
    res = run_in_subreaper(kernel)
    seen = json.loads(res["out"].strip().splitlines()[-1])
    assert res["code"] == 0
    if not fail:
        assert len(seen["pids"]) == 2
    assert seen["alive"] == [], f"daemons alive when launch returned: {seen}"
    assert res["left"] == [], f"left in the kernel's tree: {res['left']}"


POOL_JOB = '''
def child_and_daemon(ctx):
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return [child.pid, textbook_daemon(ctx)]
'''


def test_a_pool_jobs_children_die_before_the_next_job_and_with_a_killed_kernel() -> None:
    kernel = DAEMON + POOL_JOB + '''
import json, os, signal, sys, labkit
pool = labkit.Pool(2)
first = [p for r in pool.launch(child_and_daemon).results for p in r]
pool.launch(lambda ctx: None)  # the next job
after_next = [p for p in first if alive(p)]
last = [p for r in pool.launch(child_and_daemon).results for p in r]
print(json.dumps({"first": first, "after_next": after_next, "last": last}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the kernel dies with the pool warm
'''
    res = run_in_subreaper(kernel)
    seen = json.loads(res["out"].strip().splitlines()[-1])
    assert res["code"] == -9 and len(seen["last"]) == 4
    assert seen["after_next"] == [], "a job's children lived on into the next job"
    assert res["left"] == [], f"left after kill -9 of the pool's kernel: {res['left']}"


def test_twelve_interrupts_of_a_fresh_kernels_first_runs_then_a_normal_run(tmp_path,
                                                                           monkeypatch) -> None:
    """Ctrl-C at 12 random points of the first runs (registry, fork server, ranks), then a
    normal run of every strategy: each works, and nothing is left, in the tree or in TMPDIR."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    delays = [round(random.Random(25).uniform(0.0, 1.5), 3) for _ in range(12)]
    kernel = f'''
import json, signal, labkit
from labkit.config import registry

def stop(signum, frame):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, stop)
hit = 0
for delay in {delays!r}:
    signal.setitimer(signal.ITIMER_REAL, max(delay, 0.001))
    try:
        # far more steps than 1.5 s allow: every alarm lands inside a run, however fast
        labkit.run(strategy="ddp", steps=100_000, progress=False, timeout_s=60)
    except KeyboardInterrupt:
        hit += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
done = {{}}
for name in registry.names():
    res = labkit.run(strategy=name, steps=2, progress=False, timeout_s=120)
    done[name] = res.params_sha256 is not None or bool(res.metrics)
print(json.dumps({{"hit": hit, "done": done}}))
'''
    res = run_in_subreaper(kernel, timeout_s=500)
    seen = json.loads(res["out"].strip().splitlines()[-1])
    assert res["code"] == 0 and seen["hit"] == 12, seen
    assert all(seen["done"].values()) and len(seen["done"]) >= 10, seen
    assert res["left"] == [], res["left"]
    left = [e for e in os.listdir(tmp_path) if not e.startswith("torchinductor_")]
    assert left == [], f"temp files left: {left}"


def test_a_run_directory_a_killed_kernel_left_is_removed_by_the_next_run(tmp_path,
                                                                        monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    kernel = '''
import os, signal, labkit
def wait(ctx):
    if ctx.rank == 0:
        print(os.environ["LABKIT_RUN_DIR"], flush=True)
    import time
    time.sleep(600)
pool = labkit.Pool(2)
import threading
threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
pool.launch(wait, timeout_s=300)
'''
    res = run_in_subreaper(kernel)
    assert res["code"] == -9 and res["left"] == []
    stale = [e for e in os.listdir(tmp_path) if e.startswith("labkit-run-")]
    assert stale, "the killed kernel's run directory should still be there"
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    import labkit

    labkit.launch(lambda ctx: None, 1, timeout_s=60)
    assert [e for e in os.listdir(tmp_path) if e.startswith("labkit-run-")] == []
    assert Path(tmp_path).exists()
