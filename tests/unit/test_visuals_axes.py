"""Figures a student reads at a glance: the axis rules every lesson figure follows.

Log axes carry plain ticks (``2 ms``, ``64 KB``, ``10x``), never ``6x10^0``; counts and ranks
carry whole-number ticks, ranks named by their grid coordinates; labels over bars stay
inside the axes. Checked on the figure functions with small hand-made inputs.
"""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.visuals import axes as ax_rules


def _labels(axis) -> list[str]:
    axis.figure.canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


@pytest.mark.parametrize(("unit", "value", "text"), [
    ("bytes", 4000, "4 KB"), ("bytes", 2.5e6, "2.5 MB"), ("bytes", 512, "512 B"),
    ("seconds", 2e-3, "2 ms"), ("seconds", 5e-5, "50 µs"), ("seconds", 1.5, "1.5 s"),
    ("times", 0.5, "0.5x"), ("times", 10, "10x"), ("ms", 0.5, "0.5 ms")])
def test_plain_tick_texts(unit: str, value: float, text: str) -> None:
    """Each unit is written as it is spoken."""
    assert ax_rules.FORMATS[unit](value) == text


def test_log_ticks_are_plain_numbers_at_1_2_5() -> None:
    """A log axis gets ticks at 1, 2 and 5 per decade inside the data, plain text, and no
    labelled minor ticks."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([4e3, 4e6], [3e-4, 9e-3])
    ax_rules.log_ticks(ax, "x", "bytes")
    ax_rules.log_ticks(ax, "y", "seconds")
    xs, ys = _labels(ax.xaxis), _labels(ax.yaxis)
    assert all("^" not in t and "$" not in t for t in xs + ys), (xs, ys)
    assert "10 KB" in xs and "1 MB" in xs and "1 ms" in ys and "5 ms" in ys
    assert not [t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text()]
    plt.close(fig)


def test_staleness_histograms_tick_whole_updates() -> None:
    """Lesson 11's histograms: a BSP run (every gradient 0 updates late) ticks 0, 1, 2,
    never -0.25 or 0.25; the counts axis is whole too."""
    from labkit.visuals.ps import plot_staleness

    run = lambda c, hist: SimpleNamespace(metrics={"staleness_hist": hist, "consistency": c})
    exp = SimpleNamespace(runs={"bsp": run("bsp", [60]), "asp": run("asp", [13, 38, 8, 1])})
    fig = plot_staleness(exp)
    for axis in fig.axes:
        ticks = [float(t) for t in _labels(axis.xaxis)]
        assert ticks and all(t == int(t) and t >= 0 for t in ticks), ticks
        assert all(float(t) == int(float(t)) for t in _labels(axis.yaxis))


def test_memory_per_rank_ticks_each_rank_with_its_grid_coordinates() -> None:
    """Lesson 09: one tick per rank (0, 1, 2, 3, never 0.5), each named by its place on
    the grid."""
    from labkit.visuals.parallel3d import plot_rank_memory

    state = {"params": 1e5, "grads": 1e5, "optimizer": 1e5}
    res = SimpleNamespace(metrics={"per_rank_bytes": [state] * 4, "predicted_bytes": [state] * 4,
                                   "grid": {"dp": 1, "pp": 2, "tp": 2}})
    fig = plot_rank_memory(res)
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [0, 1, 2, 3]
    assert _labels(ax.xaxis) == ["rank 0\npp0 tp0", "rank 1\npp0 tp1", "rank 2\npp1 tp0",
                                 "rank 3\npp1 tp1"]


def test_compression_speedups_read_as_multipliers() -> None:
    """Lesson 10: the speedup axis is a log axis ticked 1x, 2x, 5x, ... not 10^0."""
    from labkit.visuals.cluster import plot_compression_links

    rows = [{"method": m, "wire_bytes": b, "speedup_loopback": lo, "speedup_link": li}
            for m, b, lo, li in (("none", 8e5, 1.0, 1.0), ("fp16", 4e5, 0.9, 2.3),
                                 ("topk", 1.7e4, 0.8, 9.0))]
    fig = plot_compression_links({"rows": rows})
    labels = _labels(fig.axes[0].yaxis)
    assert "1x" in labels and "2x" in labels and all("^" not in t for t in labels), labels


def test_labels_over_the_tallest_bar_stay_inside_the_axes() -> None:
    """Lesson 10's DDP figure: the efficiency written over the tallest bar lies below the
    top of the axes (it was clipped: 'eff 5%')."""
    from labkit.visuals.cluster import plot_ddp_links

    rows = [{"name": n, "nodes": k, "link": None, "step_s": t, "compute_s": 0.005,
             "exposed_s": t - 0.006, "other_s": 0.001, "efficiency": 0.006 / t,
             "predicted_step_s": p} for n, k, t, p in (("1 rank", 1, 0.006, None),
                                                          ("2 nodes x 1 rank, slow", 2, 0.14, 0.14))]
    fig = plot_ddp_links({"rows": rows})
    ax = fig.axes[0]
    fig.canvas.draw()
    top = ax.get_window_extent().y1
    for text in ax.texts:
        assert text.get_window_extent().y1 <= top, text.get_text()
