"""``labkit.Pool`` and ``labkit.pool`` without processes: bad input is a ConfigError before
any rank starts, a pool starts its ranks only when first used, and a kernel has one pool."""

from __future__ import annotations

import pytest

import labkit
import labkit.base.devices
from labkit.base.errors import ConfigError, LabError
from labkit.launchers import pool as warmpool


def test_bad_pool_arguments_are_refused_before_anything_starts() -> None:
    """world_size, backend and threads follow RunConfig's rules, named with an example."""
    with pytest.raises(ConfigError) as err:
        labkit.Pool(0, backend="mpi", threads_per_rank=1.5)
    text = str(err.value)
    assert "world_size (0)" in text and "backend 'mpi'" in text and "threads_per_rank (1.5)" in text
    with pytest.raises(ConfigError, match="world_size"):
        labkit.Pool(True)


def test_a_run_must_fit_the_pool() -> None:
    """A run for another world size or backend is a ConfigError naming both sizes; the
    pool stays cold (nothing was started)."""
    pool = labkit.Pool(2, backend="gloo")
    with pytest.raises(ConfigError, match=r"world_size \(3\) must equal this pool's \(2\)"):
        pool.run(strategy="ddp", world_size=3)
    with pytest.raises(ConfigError, match="GPU"):  # no GPUs here: refused by RunConfig
        pool.run(strategy="ddp", world_size=2, backend="nccl")
    if labkit.base.devices.gpu_count() < 2:
        with pytest.raises(ConfigError, match="GPU"):
            labkit.Pool(2, backend="nccl")
    with pytest.raises(ConfigError, match="fn"):
        pool.launch("not a function")
    assert not pool.warm and pool.starts == 0
    pool.close()
    with pytest.raises(LabError, match="closed"):
        pool.launch(lambda ctx: ctx.rank)


def test_one_pool_per_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """labkit.pool(n) hands every caller the same pool; another size replaces it (the old
    one is closed, so a kernel never holds two sets of ranks)."""
    monkeypatch.setattr(warmpool, "_KERNEL_POOL", None)
    first = labkit.pool(2)
    assert labkit.pool(2) is first and labkit.pool(2, "gloo") is first
    other = labkit.pool(3)
    assert other is not first and first.closed and not other.closed
    with pytest.raises(ConfigError):
        labkit.pool(0)
    assert not other.closed  # a refused request leaves the current pool alone
    other.close()
    assert labkit.pool(3) is not other
    warmpool._close_kernel_pool()
