"""How a rank waits for its all-reduces (``labkit.trace.comm.spin_waits``): sleeping unless
asked, and then polling only gloo ranks that each have a core; a value it does not know is
refused before any rank starts."""

from __future__ import annotations

import os

import pytest

import labkit
from labkit.base.errors import ConfigError
from labkit.base.validate import COMM_WAIT_ENV as WAIT_ENV
from labkit.trace.comm import spin_waits

pytestmark = pytest.mark.lesson00

RULE = "LABKIT_COMM_WAIT='busy' must be 'sleep' or 'spin'"


def test_ranks_sleep_unless_asked(monkeypatch):
    monkeypatch.delenv(WAIT_ENV, raising=False)
    assert not spin_waits("gloo", 2)
    monkeypatch.setenv(WAIT_ENV, "sleep")
    assert not spin_waits("gloo", 1)


def test_asked_to_spin_only_gloo_ranks_with_a_core_each(monkeypatch):
    monkeypatch.setenv(WAIT_ENV, "spin")
    cores = len(os.sched_getaffinity(0))
    assert spin_waits("gloo", cores)
    assert not spin_waits("gloo", cores + 1)
    assert not spin_waits("nccl", 1)


def test_a_bad_value_names_itself_and_the_choices(monkeypatch):
    monkeypatch.setenv(WAIT_ENV, "busy")
    with pytest.raises(ValueError, match=RULE):
        spin_waits("gloo", 2)


def test_a_bad_value_is_refused_before_any_rank_starts(monkeypatch):
    monkeypatch.setenv(WAIT_ENV, "busy")
    with pytest.raises(ConfigError, match=RULE):
        labkit.run(strategy="ddp", world_size=2, steps=1)
    with pytest.raises(ConfigError, match=RULE):
        labkit.launch(lambda ctx: None, 2)
