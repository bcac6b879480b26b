"""Every lesson-06 figure returns a Figure holding the predicted and measured data it shows."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.lessons.compression import fit_and_validate, overlap_row
from labkit.theory.comm import ring_allreduce_time
from labkit.theory.interconnect import INTERCONNECTS
from labkit.visuals import comm as vc

pytestmark = pytest.mark.lesson06


def _timeline() -> Timeline:
    """Two ranks, one steady step: compute 0-60, comm 50-100 (10 of 50 hidden), span 0-100."""
    ev = []
    for r in (0, 1):
        for s, off in ((0, 0), (1, 1000)):
            ev += [Event(r, Lane.STEP, Op.STEP, off, 100, step=s),
                   Event(r, Lane.COMPUTE, Op.FORWARD, off, 60, step=s),
                   Event(r, Lane.COMM, Op.ALL_REDUCE, off + 50, 50, step=s, bytes=400)]
    return Timeline(ev, 2)


def test_interconnect_plot_has_a_line_per_link_and_measured_dots() -> None:
    links = [INTERCONNECTS["nvlink4"], INTERCONNECTS["ethernet_10g"]]
    fig = vc.plot_interconnects(links, sizes=[1e3, 1e6], measured=([1e6], [0.01]))
    ax = fig.axes[0]
    assert isinstance(fig, Figure) and len(ax.lines) == 2 and len(ax.collections) == 1
    assert ax.lines[0].get_ydata()[1] == pytest.approx(ring_allreduce_time(1e6, 8, 2e-6, 450e9))


def test_fit_validation_plot_marks_fit_and_held_out_points() -> None:
    sizes = [1e6, 2e6, 4e6, 8e6]
    report = fit_and_validate(sizes, [ring_allreduce_time(s, 2, 1e-5, 1e9) for s in sizes], 2)
    ax = vc.plot_fit_validation(report).axes[0]
    offsets = [len(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets")]
    assert 2 in offsets and "held-out" in ax.get_title()


def test_strategy_plot_stacks_three_parts_per_strategy_and_link() -> None:
    links = [INTERCONNECTS["nvlink4"], INTERCONNECTS["infiniband_hdr"]]
    fig = vc.plot_strategy_links(links, compute_s=1.0, params=1e9, hidden=4096, layers=32,
                                 batch=8, seq=2048, microbatches=8)
    assert len(fig.axes[0].patches) == 3 * 3 * 2


def test_compression_plot_shows_measured_and_predicted_bytes_and_losses() -> None:
    comp = {"rows": [{"method": m, "wire_bytes": b, "predicted_wire_bytes": b, "ratio": 1.0,
                      "step_time_s": 0.01, "final_loss": 1.0}
                     for m, b in (("none", 100.0), ("fp16", 50.0))],
            "losses": {"none": [2.0, 1.0], "fp16": [2.0, 1.1]}}
    bars, curves = vc.plot_compression_tradeoff(comp).axes
    assert [p.get_height() for p in bars.patches] == [100.0, 50.0, 100.0, 50.0]
    assert len(curves.lines) == 2


def test_utilisation_and_overlap_from_a_timeline() -> None:
    tl = _timeline()
    shares = vc.rank_shares(tl)
    assert shares[0] == pytest.approx({"compute": 0.6, "comm": 0.4, "idle": 0.0})
    fig = vc.plot_tp_utilisation({"tp": tl})
    assert len(fig.axes[0].patches) == 2 * 3
    row = overlap_row("toy", tl)
    assert row["overlap_fraction"] == pytest.approx(0.2)
    ax = vc.plot_overlap([row]).axes[0]
    assert [p.get_width() for p in ax.patches] == pytest.approx([10e-6, 40e-6])


def test_tp_bytes_plot_has_measured_and_predicted_bars_per_layer() -> None:
    m = {"comm_bytes_per_layer_measured": [{"forward": 8, "backward": 8}] * 2,
         "comm_bytes_per_layer_predicted": {"forward": 8.0, "backward": 8.0}}
    assert len(vc.plot_tp_bytes(m).axes[0].patches) == 2 * 2 * 2
