"""Where labkit keeps its state and its cache (``labkit.base.places``): the platform's
places from platformdirs, the LABKIT_HOME / LABKIT_CACHE overrides, and an existing
``~/.labkit`` kept in use so no one's quiz progress is left behind."""

from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from labkit.analysis import calibrate
from labkit.base import places
from labkit.quiz.store import default_path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home directory with no labkit settings in the environment."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("LABKIT_HOME", "LABKIT_CACHE", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_a_new_user_gets_the_platforms_places(home: Path) -> None:
    assert places.state_dir() == platformdirs.user_data_path("labkit")
    assert str(places.state_dir()).startswith(str(home))
    assert default_path() == places.state_dir() / "quiz.json"
    assert calibrate.cache_dir() == platformdirs.user_cache_path("labkit")


def test_an_existing_dot_labkit_stays_in_use(home: Path) -> None:
    (home / ".labkit").mkdir()
    assert places.state_dir() == home / ".labkit"
    assert default_path() == home / ".labkit" / "quiz.json"


def test_the_environment_overrides_both(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (home / ".labkit").mkdir()
    monkeypatch.setenv("LABKIT_HOME", str(home / "state"))
    monkeypatch.setenv("LABKIT_CACHE", "~/cache")
    assert places.state_dir() == home / "state"
    assert calibrate.cache_dir() == home / "cache"
