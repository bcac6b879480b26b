"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from labkit import api
from labkit.launchers import supervisor


@pytest.fixture
def no_process_may_start(monkeypatch):
    """Any attempt to start a rank fails the test: bad input is refused before launch."""
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started for bad input")

    monkeypatch.setattr(supervisor.subprocess, "Popen", refuse)
    monkeypatch.setattr(api, "supervise", refuse)
