"""The ZeRO partitions diagram (lesson 05) draws what the formula counts, slice by slice."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.theory import bytes_per_param, zero_memory
from labkit.visuals.concepts.zero import zero_partitions

pytestmark = pytest.mark.lesson05


def _boxes(fig):
    out = {}
    for ax in fig.axes:
        for p in ax.patches:
            if p.get_gid():
                stage, rank, term, k = p.get_gid().split("/")
                out[(int(stage[1:]), int(rank[1:]), term, int(k))] = p
    return out


@pytest.mark.parametrize("n", [2, 4])
def test_each_stage_shards_its_terms_into_n_slices_and_keeps_one(n: int) -> None:
    """Stage 1 cuts the optimizer state, 2 also the gradients, 3 also the parameters into
    n slices; rank r fills only slice r of a sharded term and the whole of the others."""
    boxes = _boxes(zero_partitions(n))
    first = {"optimizer": 1, "grads": 2, "params": 3}
    for stage in range(4):
        for rank in range(n):
            for term, since in first.items():
                slices = [b for (s, r, t, _), b in boxes.items() if (s, r, t) == (stage, rank, term)]
                filled = [k for (s, r, t, k), b in boxes.items()
                          if (s, r, t) == (stage, rank, term) and b.get_fill()]
                if stage >= since:
                    assert len(slices) == n and filled == [rank]
                else:
                    assert len(slices) == 1 and filled == [0]


def test_kept_width_per_rank_is_the_formula() -> None:
    """The filled width of every rank's bar is zero_memory(1 parameter) for its stage, and the
    panel's label says the same number."""
    n = 4
    fig = zero_partitions(n)
    boxes = _boxes(fig)
    assert bytes_per_param()["total"] == pytest.approx(fig.axes[0].get_xlim()[1])
    for stage in range(4):
        want = zero_memory(1.0, n, stage)["total"]
        for rank in range(n):
            kept = sum(b.get_width() for (s, r, _, _), b in boxes.items()
                       if (s, r) == (stage, rank) and b.get_fill())
            assert kept == pytest.approx(want)
        assert fig.axes[stage].get_xlabel().startswith(f"{want:.3g} B per parameter")
        assert fig.axes[stage].get_title().startswith(f"ZeRO-{stage}")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["parameters (2 B/param)", "gradients (2 B/param)",
                          "optimizer state (12 B/param)"]


def test_one_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="world_size"):
        zero_partitions(1)
