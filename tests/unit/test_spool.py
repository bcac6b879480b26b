"""The event spool: what a rank writes as it goes comes back as the same Events, a write
torn by a kill costs only itself, and clearing the tracer never re-sends or skips records."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.errors import RankFailure, RunFailed
from labkit.base.events import Op
from labkit.trace import spool as spool_module
from labkit.trace.spool import Spool, read_spool, read_spools, spool_path
from labkit.trace.tracer import Tracer

pytestmark = pytest.mark.lesson00


def _step(tracer: Tracer, step: int) -> None:
    t = tracer.origin_ns + 1000 * step
    tracer.record(Op.FORWARD, t, t + 400, step=step)
    tracer.record(Op.ALL_REDUCE, t + 400, t + 900, step=step, bytes=64)


def test_spooled_events_equal_the_tracers(tmp_path: Path) -> None:
    tracer = Tracer(rank=1)
    spool = Spool(spool_path(tmp_path, 1), tracer, offset_ns=50)
    for step in range(3):
        _step(tracer, step)
        spool.write()
    assert read_spool(spool_path(tmp_path, 1)) == tracer.events(50)
    assert read_spools(tmp_path, 2) == tracer.events(50)  # rank 0 wrote nothing: no file


def test_step_and_cpu_spans_go_as_fixed_rows_and_the_rest_marshalled(tmp_path: Path) -> None:
    """A write of spans that carry only a step and a CPU time (a one-rank step) is one record
    of fixed binary rows; a write with anything more is marshalled; both read back alike,
    a CPU time of 0 apart from none."""
    tracer = Tracer(rank=0)
    path = spool_path(tmp_path, 0)
    spool = Spool(path, tracer, offset_ns=7)
    t = tracer.origin_ns
    chain = tracer.chain(0)
    chain.next(Op.FORWARD)
    chain.next(Op.BACKWARD)
    chain.end()
    tracer.record(Op.STEP, t, t + 900, 0)
    spool.write()
    size = path.stat().st_size
    rows = list(spool_module._records(path.read_bytes()))[1]
    assert rows[0] == spool_module._ROWS and len(rows) == 1 + 3 * spool_module._ROW.size
    _step(tracer, 1)  # an all-reduce's bytes: marshalled
    spool.write()
    tracer.record(Op.OPTIMIZER, t + 5, t + 9, step=2, cpu_ns=0)
    tracer.record(Op.STEP, t + 1, t + 10, step=None)  # no step: marshalled
    spool.write()
    kinds = [r[0] for r in list(spool_module._records(path.read_bytes()))[1:]]
    assert kinds == [spool_module._ROWS, spool_module._MARSHAL, spool_module._MARSHAL]
    events = read_spool(path)
    assert sorted(events, key=lambda e: e.start_ns) == tracer.events(7)
    assert [e.cpu_ns for e in events if e.op is Op.OPTIMIZER] == [0]
    assert [e.cpu_ns for e in events if e.op is Op.STEP] == [None, None]
    assert path.stat().st_size == size  # still inside the first mapping


def test_a_torn_last_write_is_dropped_and_the_rest_kept(tmp_path: Path, monkeypatch) -> None:
    tracer = Tracer(rank=0)
    path = spool_path(tmp_path, 0)
    spool = Spool(path, tracer, 0)
    _step(tracer, 0)
    spool.write()

    class KilledBeforeTheCommit:  # the kill landed after the bytes, before their length
        size = spool_module._LEN.size

        def pack_into(self, *args: object) -> None:
            raise KeyboardInterrupt

    monkeypatch.setattr(spool_module, "_LEN", KilledBeforeTheCommit())
    _step(tracer, 1)
    with pytest.raises(KeyboardInterrupt):
        spool.write()
    monkeypatch.undo()
    assert [e.step for e in read_spool(path)] == [0, 0]
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) // 2 ** 10])  # a file cut short, mid-header
    assert read_spool(path) == []
    path.write_bytes(b"not a spool")
    assert read_spool(path) == []


def test_a_killed_process_keeps_every_step_it_finished(tmp_path: Path) -> None:
    """The spool is a shared file mapping: what a step stored is in the page cache, and a
    SIGKILL a moment later (no exit handler, no flush) loses none of it."""
    code = textwrap.dedent(f"""
        import os, signal
        from labkit.base.events import Op
        from labkit.trace.spool import Spool, spool_path
        from labkit.trace.tracer import Tracer
        tracer = Tracer(rank=0)
        spool = Spool(spool_path({str(tmp_path)!r}, 0), tracer, 0)
        for step in range(3000):  # past the first mapping's size: it grows, twice
            with tracer.span(Op.FORWARD, step=step):
                pass
            tracer.record(Op.STEP, tracer.clock(), tracer.clock(), step)
            spool.write()
        with tracer.span(Op.FORWARD, step=3000):  # in flight: never written
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    events = read_spool(spool_path(tmp_path, 0))
    steps = [e.step for e in events if e.op is Op.STEP]
    assert steps == list(range(3000))
    assert [e.step for e in events if e.op is Op.FORWARD] == list(range(3000))
    assert all(e.cpu_ns is not None for e in events if e.op is Op.FORWARD)


def test_clear_keeps_the_write_index_right(tmp_path: Path) -> None:
    tracer = Tracer(rank=0)
    path = spool_path(tmp_path, 0)
    spool = Spool(path, tracer, 0)
    _step(tracer, 0)
    spool.write()
    _step(tracer, 1)
    tracer.clear()  # the tracer forgets step 1 before it was written (bench code clears)
    _step(tracer, 2)
    spool.write()
    assert [e.step for e in read_spool(path)] == [0, 0, 2, 2]


def test_the_notebook_error_points_at_the_partial_timeline() -> None:
    err = RunFailed(RankFailure(1, "signal", "rank 1 was killed by SIGKILL"))
    assert not any("err.timeline" in line for line in err._render_traceback_())
    tracer = Tracer(rank=0)
    _step(tracer, 0)
    err.timeline = Timeline(tracer.events(), 2)
    assert "err.timeline, 2 events" in err._render_traceback_()[-1]
