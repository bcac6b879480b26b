"""The class test runs only when asked for (``pytest -m classroom tests/classroom``).

It creates Linux users, starts JupyterHub and a browser, and grades a class: minutes of
work that ``make test`` does not run; ``.ci/run`` runs it as a group of its own after.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "classroom" in (config.getoption("markexpr", "") or ""):
        return
    mine = [item for item in items if HERE in Path(str(item.fspath)).parents]
    if mine:
        config.hook.pytest_deselected(items=mine)
        items[:] = [item for item in items if item not in mine]
