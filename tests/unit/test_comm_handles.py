"""Async comm spans are recorded exactly once, even when the backend's completion callback
runs after training has finished (the race that dropped PowerSGD's last all-reduce)."""

from __future__ import annotations

import pytest

from labkit.base.events import Op
from labkit.trace.comm import Comm, Handle
from labkit.trace.tracer import Tracer

pytestmark = pytest.mark.lesson00


class LateFuture:
    """A future whose done-callbacks run only when the test says so."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def add_done_callback(self, fn) -> None:
        self.callbacks.append(fn)

    def fire(self) -> None:
        for fn in self.callbacks:
            fn(self)


class FakeWork:
    def __init__(self) -> None:
        self.fut = LateFuture()
        self.waited = 0

    def get_future(self) -> LateFuture:
        return self.fut

    def wait(self) -> None:
        self.waited += 1

    def is_completed(self) -> bool:
        return True


class Status:
    value = 0


def test_drain_records_an_op_whose_callback_has_not_run_yet():
    tracer = Tracer(rank=0)
    status = Status()
    comm = Comm(tracer, 0, 2, status=status)
    work = FakeWork()
    Handle(comm, work, Op.ALL_REDUCE, tracer.now(), {"bytes": 64, "step": 9})
    assert status.value == 1  # an op in flight: the rank is waiting on a peer
    assert tracer.events() == []  # the callback has not run: nothing recorded yet
    comm.drain()
    events = tracer.events()
    assert [(e.op, e.bytes, e.step) for e in events] == [(Op.ALL_REDUCE, 64, 9)]
    assert work.waited == 1 and status.value == 0
    work.fut.fire()  # the late callback must not record the span a second time
    assert len(tracer.events()) == 1


def test_callback_first_then_drain_records_once():
    tracer = Tracer(rank=0)
    comm = Comm(tracer, 0, 2)
    work = FakeWork()
    Handle(comm, work, Op.SEND, tracer.now(), {"peer": 1})
    work.fut.fire()
    comm.drain()
    assert len(tracer.events()) == 1 and work.waited == 0


class FuturelessWork(FakeWork):
    """Like a gloo send / recv: asking for a future raises, and costs time on every ask."""

    asked = 0

    def get_future(self) -> LateFuture:
        type(self).asked += 1
        raise RuntimeError("this work has no future")


def test_a_backend_without_futures_is_asked_once_per_op_kind():
    from labkit.trace import comm as comm_module
    comm_module._NO_FUTURE.difference_update({(FuturelessWork, Op.SEND), (FuturelessWork, Op.RECV)})
    FuturelessWork.asked = 0
    tracer = Tracer(rank=0)
    comm = Comm(tracer, 0, 2)
    handles = [Handle(comm, FuturelessWork(), Op.SEND, tracer.now(), {"peer": 1})
               for _ in range(5)]
    assert FuturelessWork.asked == 1  # remembered after the first RuntimeError
    for h in handles:  # still recorded, at wait(), since no callback will come
        h.wait()
    # (a WAIT span may join them when a busy machine makes wait() take > 20 us)
    assert [e.op for e in tracer.events() if e.op is not Op.WAIT] == [Op.SEND] * 5
    Handle(comm, FuturelessWork(), Op.RECV, tracer.now(), {"peer": 1}).wait()
    assert FuturelessWork.asked == 2  # a different op is asked on its own
