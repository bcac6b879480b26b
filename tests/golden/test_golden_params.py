"""Refactoring guard: every golden run ends with the very parameters recorded before.

``tests/golden/runs.py`` lists one short run per strategy, model (mlp, gpt, digits), ZeRO
stage, compression method and the parameter server; ``params.json`` holds each run's final
``params_sha256`` as recorded on a machine kind (torch build and CPU instruction set). Same
code, same seed, same kernels: the same bits. A change that moves a single weight of any
run fails here with the run's name.
"""

from __future__ import annotations

import pytest

from tests.golden import runs

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def _table() -> dict[str, str | None]:
    table = runs.recorded().get(runs.machine_key())
    if table is None:
        pytest.skip(f"no golden values recorded for {runs.machine_key()} (floating-point "
                    f"kernels differ between machine kinds); record them before a refactor "
                    f"with `python -m tests.golden.runs --record`")
    return table


@pytest.mark.parametrize("name", list(runs.RUNS))
def test_golden_run_ends_with_the_recorded_parameters(name: str) -> None:
    """``labkit.run`` of the golden run ``name`` reports the recorded ``params_sha256``."""
    table = _table()
    if name not in table:
        pytest.skip(f"{name} has no recorded value on {runs.machine_key()}; record it with "
                    f"`python -m tests.golden.runs --record {name}`")
    got = runs.run_one(name)
    assert got == table[name], (
        f"golden run {name} ({runs.RUNS[name]}) ended with params_sha256 {got}, recorded "
        f"{table[name]}: the change moved its weights")


def test_every_run_that_trains_reports_a_hash() -> None:
    """Every golden run's recorded value is a hash: no strategy leaves its final weights
    unfingerprinted (a pipeline run hashes all stages in one fixed order)."""
    table = _table()
    missing = sorted(name for name in runs.RUNS if table.get(name) is None)
    assert not missing, f"runs recorded without params_sha256: {missing}"
