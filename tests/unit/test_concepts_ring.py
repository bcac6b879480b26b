"""Lesson 01's ring diagram draws the plan its hand-written ring runs: after n-1 reduce-scatter
steps rank r owns the full sum of chunk (r+1) mod n, after n-1 all-gather steps every rank
holds every sum, and in every step each rank sends exactly one chunk."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from labkit.theory.comm import ring_allreduce_bytes, ring_allreduce_steps
from labkit.visuals.concepts.ring import cell_text, plot_ring_steps, ring_plan

pytestmark = pytest.mark.lesson01


def _cells(fig):
    return {p.get_gid(): p for ax in fig.axes for p in ax.patches if p.get_gid()}


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_three_ranks_five_panels_nine_cells_each() -> None:
    """Start, 2 reduce-scatter and 2 all-gather steps; 3 ranks x 3 chunks per panel."""
    fig = plot_ring_steps(3)
    assert [ax.get_title() for ax in fig.axes] == [
        "start", "reduce-scatter step 1", "reduce-scatter step 2", "all-gather step 1",
        "all-gather step 2"]
    assert all(len(ax.patches) == 9 for ax in fig.axes)
    assert _texts(fig.axes[0]) == ["0", "0", "0", "1", "1", "1", "2", "2", "2"]
    assert _texts(fig.axes[-1]) == ["Σ"] * 9


def test_after_the_reduce_scatter_rank_r_owns_chunk_r_plus_1() -> None:
    """The drawn state after step n-1: rank r's chunk (r+1) mod n is "Σ" and no other is."""
    fig = plot_ring_steps(3)
    ax = fig.axes[2]
    for r in range(3):
        row = _texts(ax)[3 * r:3 * r + 3]
        assert [c for c in range(3) if row[c] == "Σ"] == [(r + 1) % 3], (r, row)


def test_each_rank_sends_one_chunk_per_step_2n_minus_2_in_all() -> None:
    """Every step outlines exactly one sent chunk per rank, none at the start: 2(n-1) chunks
    of S/n per rank, the 2(n-1)/n x S the title states."""
    fig = plot_ring_steps(3)
    sent = [g for g in _cells(fig) if g.endswith("/sent")]
    assert not [g for g in sent if g.startswith("m0/")]
    for m in range(1, 5):
        assert sorted(g.split("/")[1] for g in sent if g.startswith(f"m{m}/")) == ["r0", "r1", "r2"]
    assert "4 steps" in fig.texts[0].get_text() and "4/3 S per rank" in fig.texts[0].get_text()


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_plan_computes_an_all_reduce(n: int) -> None:
    """Carry real numbers through the plan's sends: every rank ends with the sum of every
    chunk, as torch's sum says (the plan is an all-reduce, not just a picture)."""
    values = [torch.arange(n, dtype=torch.float64) * 10 ** r for r in range(n)]
    held = [v.clone() for v in values]
    plan = ring_plan(n)
    for title, _, sent in plan[1:]:
        before = [h.clone() for h in held]
        for r in range(n):
            left = (r - 1) % n
            c = sent[left]  # what arrives from the left is the chunk the left rank sent
            held[r][c] = before[r][c] + before[left][c] if title.startswith("reduce") \
                else before[left][c]
    total = sum(values)
    assert all(torch.equal(h, total) for h in held)
    assert plan[-1][1] == [[frozenset(range(n))] * n for _ in range(n)]


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_the_plan_takes_the_steps_the_cost_model_charges(n: int) -> None:
    """The drawn plan's sends are the 2(n-1) messages theory.comm charges alpha for, each
    rank sending one 1/n chunk per step: 2(n-1)/n x S, ring_allreduce_bytes."""
    plan = ring_plan(n)
    assert len(plan) - 1 == ring_allreduce_steps(n)
    assert (len(plan) - 1) / n == pytest.approx(ring_allreduce_bytes(1.0, n))


def test_cell_text_and_bad_n() -> None:
    assert cell_text(frozenset({2, 0}), 3) == "0+2" and cell_text(frozenset({0, 1, 2}), 3) == "Σ"
    with pytest.raises(ValueError, match="must be >= 2"):
        ring_plan(1)
