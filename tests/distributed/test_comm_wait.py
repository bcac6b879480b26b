"""Ranks that poll their all-reduces (``LABKIT_COMM_WAIT=spin``, ``labkit.trace.comm``) train
exactly as ranks that sleep in them: the same weights to the bit, every span still traced,
and point-to-point work (which gloo completes only inside ``wait``) still waited on."""

from __future__ import annotations

import pytest

import labkit
from labkit.base.events import Op
from labkit.config.run import ModelConfig

pytestmark = [pytest.mark.distributed, pytest.mark.lesson00]

MODEL = ModelConfig(width=64, depth=2)


def _both(monkeypatch: pytest.MonkeyPatch, **kw: object) -> dict[str, labkit.RunResult]:
    out = {}
    for way in ("sleep", "spin"):
        monkeypatch.setenv("LABKIT_COMM_WAIT", way)
        out[way] = labkit.run(world_size=2, steps=3, model=MODEL, progress=False, **kw)
    return out


@pytest.mark.parametrize("strategy, options", [("ddp-naive", None), ("ddp-bucketed", None),
                                               ("zero", {"stage": 2})])
def test_polling_ranks_train_the_same_weights_and_trace_every_collective(monkeypatch, strategy,
                                                                         options):
    runs = _both(monkeypatch, strategy=strategy, options=options)
    assert runs["sleep"].params_sha256 == runs["spin"].params_sha256
    for r in runs.values():
        comm = [e for e in r.timeline.events if e.op in (Op.ALL_REDUCE, Op.REDUCE_SCATTER,
                                                          Op.ALL_GATHER)]
        assert comm, f"{strategy}: no collective traced"
    count = {way: sum(1 for e in r.timeline.events if e.op != Op.WAIT) for way, r in runs.items()}
    assert count["sleep"] == count["spin"], count


def test_a_polling_pipeline_still_waits_for_its_sends_and_receives(monkeypatch):
    runs = _both(monkeypatch, strategy="pipeline",
                 options={"schedule": "1f1b", "stages": 2, "microbatches": 4})
    assert runs["sleep"].params_sha256 == runs["spin"].params_sha256
    sends = [e for e in runs["spin"].timeline.events if e.op == Op.SEND]
    assert sends and all(e.dur_ns >= 0 for e in sends)
