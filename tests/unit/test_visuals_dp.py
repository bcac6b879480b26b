"""Every lesson-01 figure function returns a Figure with the expected artists and data."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.analysis.timeline import Timeline
from labkit.base.events import Event, Lane, Op
from labkit.theory import AlphaBeta
from labkit.visuals import dp
from labkit.visuals.ring_anim import plot_ring_state, ring_animation_html, ring_record, stage_title

pytestmark = pytest.mark.lesson01


def _ring_results() -> list[dict]:
    """What two ranks record for [1, 2] + [10, 20] (hand-checked ring steps)."""
    return [
        {"rank": 0, "world_size": 2, "bounds": [[0, 1], [1, 2]], "start": [1, 2],
         "result": [11, 22], "values": [[1, 2], [1, 22], [11, 22]],
         "transfers": [{"phase": "reduce-scatter", "step": 0, "src": 0, "dst": 1, "chunk": 0,
                        "bytes": 4},
                       {"phase": "all-gather", "step": 0, "src": 0, "dst": 1, "chunk": 1,
                        "bytes": 4}]},
        {"rank": 1, "world_size": 2, "bounds": [[0, 1], [1, 2]], "start": [10, 20],
         "result": [11, 22], "values": [[10, 20], [11, 20], [11, 22]],
         "transfers": [{"phase": "reduce-scatter", "step": 0, "src": 1, "dst": 0, "chunk": 1,
                        "bytes": 4},
                       {"phase": "all-gather", "step": 0, "src": 1, "dst": 0, "chunk": 0,
                        "bytes": 4}]},
    ]


def _heads(ax) -> list:
    return [c for c in ax.get_children() if type(c).__name__ == "Annotation"]


def test_ring_record_and_frames() -> None:
    """Merged record groups transfers by stage; each frame shows both ranks, the ring with
    its direction on every hop (the hops carrying a chunk in the phase colour), the key to
    the notation and the bytes sent so far."""
    from labkit.visuals.ring_anim import PHASE_COLORS

    rec = ring_record(_ring_results())
    assert rec["expected"] == [11, 22] and len(rec["transfers"]) == 2
    assert [t["src"] for t in rec["transfers"][0]] == [0, 1]
    assert rec["bytes_sent"] == [[0, 0], [4, 4], [8, 8]] and not rec["traced"]
    assert rec["predicted_bytes_per_rank"] == 8.0  # 2(n-1)/n x 8 bytes
    fig = plot_ring_state(rec, 1)
    ring, key, sent = fig.axes
    texts = [t.get_text() for t in ring.texts]
    assert any("rank 0" in t and "c1: 22 ✓ ←" in t and "sent 4 B" in t for t in texts)
    assert "reduce-scatter" in ring.get_title()
    heads = _heads(ring)
    assert len(heads) == 2 * 2  # two arrowheads on each of the 2 hops, in every frame
    assert {h.arrow_patch.get_edgecolor()[:3] for h in heads} == {
        tuple(int(PHASE_COLORS["reduce-scatter"][i:i + 2], 16) / 255 for i in (1, 3, 5))}
    note = key.texts[0].get_text()
    assert "c0 = element 0" in note and "Σ10" in note and "✓" in note
    assert [b.get_height() for b in sent.patches if b.get_width() == 0.6] == [4, 4]
    start = plot_ring_state(rec, 0).axes[0]
    assert len(_heads(start)) == 4  # the ring and its direction before anything moves
    assert "all-gather" in stage_title(rec, 2)
    with pytest.raises(ValueError):
        plot_ring_state(rec, 3)


def _ring_sends() -> Timeline:
    """The trace of the same all-reduce: each rank's two sends (RS0 then AG0), 4 B each."""
    ev = []
    for rank, (rs_chunk, ag_chunk) in enumerate(((0, 1), (1, 0))):
        ev += [Event(rank, Lane.COMM, Op.SEND, 100, 50, peer=1 - rank, bytes=4,
                     chunk=rs_chunk, name="RS0"),
               Event(rank, Lane.COMM, Op.RECV, 100, 60, peer=1 - rank, bytes=4,
                     chunk=rs_chunk, name="RS0"),
               Event(rank, Lane.COMM, Op.SEND, 300, 50, peer=1 - rank, bytes=4,
                     chunk=ag_chunk, name="AG0")]
    return Timeline(sorted(ev, key=lambda e: (e.start_ns, e.rank)), 2)


def test_ring_chunks_on_the_wire_come_from_the_trace() -> None:
    """With the run's trace, every chunk on the wire is a traced send (not a rank's own
    note), and the frames in between move it along the ring carrying its values."""
    from types import SimpleNamespace

    from labkit.visuals.ring_anim import draw_ring_state, ring_frames, traced_transfers

    sends = traced_transfers(_ring_sends())
    assert [(t["phase"], t["src"], t["dst"], t["bytes"]) for t in sends] == [
        ("reduce-scatter", 0, 1, 4), ("reduce-scatter", 1, 0, 4), ("all-gather", 0, 1, 4),
        ("all-gather", 1, 0, 4)]
    results = _ring_results()
    for r in results:
        r["transfers"] = []  # nothing noted by the ranks: only the trace can supply chunks
    rec = ring_record(SimpleNamespace(results=results, timeline=_ring_sends()))
    assert rec["traced"] and rec["bytes_sent"][-1] == [8, 8]
    assert ring_frames(rec, 3) == [(0, None), (1, 1 / 3), (1, 2 / 3), (1, None), (2, 1 / 3),
                                   (2, 2 / 3), (2, None)]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    draw_ring_state(ax, rec, 1, 0.5)  # mid-flight: chunks carry the sender's values
    texts = [t.get_text() for t in ax.texts]
    assert "c0: 1\n4 B" in texts and "c1: 20\n4 B" in texts
    assert any(t.startswith("rank 0") and "c1: 2\n" in t for t in texts)  # not yet added
    assert "traced sends: up to 4 B" in ax.get_title()
    plt.close(fig)


def test_ring_animation_plays_without_a_kernel() -> None:
    """A start frame, then per ring stage the chunks in flight and their arrival (five
    frames a hop by default, so a chunk glides); the jshtml string embeds every frame."""
    from labkit.visuals.ring_anim import ring_frames

    rec = ring_record(_ring_results())
    assert len(ring_frames(rec)) == 1 + 2 * 5
    html = ring_animation_html(rec, interval_ms=200, travel_frames=2)
    assert "<script" in html and html.count("data:image/png;base64") == 1 + 2 * 2


def test_plot_bench_measured_and_predicted() -> None:
    """Solid measured line, dashed predicted line per impl; busbw panel."""
    rows = [{"bytes": b, "time_s": t, "algbw_gbps": b / t / 1e9, "busbw_gbps": b / t / 1e9}
            for b, t in ((4000, 1e-4), (4e6, 4e-3))]
    ab = {"alpha_s": 2e-5, "bandwidth_gbps": 1.0, "predicted_time_s": [1e-4, 4e-3]}
    fig = dp.plot_bench({"ring": {"results": rows, "alpha_beta": ab},
                         "builtin": {"results": rows, "alpha_beta": None}})
    t_ax, b_ax = fig.axes[:2]
    assert len(t_ax.lines) == 3 and len(b_ax.lines) == 2
    assert list(t_ax.lines[1].get_ydata()) == pytest.approx([0.1, 4.0])


def test_plot_allreduce_bytes_bars_and_formula() -> None:
    """One bar per rank per scheme, in MB, with the formula marks."""
    fig = dp.plot_allreduce_bytes({"ring": [6e6, 6e6, 6e6, 6e6],
                                   "reduce_broadcast": [12e6, 4e6, 4e6, 4e6]}, 4_000_000)
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([6, 6, 6, 6, 12, 4, 4, 4])
    assert list(ax.lines[0].get_ydata()) == pytest.approx([6] * 4)


def _timeline() -> Timeline:
    ev = []
    for rank in range(2):
        for step in range(2):
            t0 = step * 100
            ev += [Event(rank, Lane.STEP, Op.STEP, t0, 90, step=step),
                   Event(rank, Lane.COMPUTE, Op.BACKWARD, t0, 50, step=step),
                   Event(rank, Lane.COMM, Op.ALL_REDUCE, t0 + 25, 50, step=step)]
    return Timeline(ev, 2)


def test_plot_dp_variants_shows_overlap_in_titles() -> None:
    """One panel per variant, titled with the measured hidden share of comm."""
    fig = dp.plot_dp_variants({"ddp-naive": _timeline(), "ddp-bucketed": _timeline()})
    titles = [a.get_title(loc="left") for a in fig.axes]
    assert any("ddp-naive" in t and "50%" in t for t in titles)


def test_plot_train_step_panels() -> None:
    """Loss bars per rank; local norms per rank plus the averaged line; updates per rank."""
    recs = [{"rank": r, "loss": 1.0 + r, "param_names": ["0.weight", "0.bias"],
             "grad_norms_local": [1.0 + r, 2.0], "grad_norms_synced": [1.5, 2.0],
             "update_norms": [0.1, 0.2]} for r in range(2)]
    fig = dp.plot_train_step(recs)
    loss_ax, grad_ax, upd_ax = fig.axes
    assert [p.get_height() for p in loss_ax.patches] == [1.0, 2.0]
    assert len(grad_ax.lines) == 3 and list(grad_ax.lines[2].get_ydata()) == [1.5, 2.0]
    assert len(upd_ax.lines) == 2


def test_scaling_prediction_and_plot() -> None:
    """Predicted t_n = t_1 + exposed ring time; efficiency panel starts at 1."""
    fit = AlphaBeta(alpha_s=1e-4, bandwidth_Bps=1e9, world_size=2)
    pred = dp.predict_scaling(0.1, 4_000_000, fit, [1, 2, 4])
    assert pred[1] == 0.1 and pred[2] == pytest.approx(0.1 + 2e-4 + 4e-3)
    stalled = AlphaBeta(alpha_s=1e-4, bandwidth_Bps=1e9, world_size=2, stall_s=1e-3)
    per_tensor = dp.predict_scaling(0.1, 4_000_000, stalled, [2], messages=10)
    assert per_tensor[2] == pytest.approx(0.1 + 10 * (2e-4 + 1e-3) + 4e-3)  # each call stalls
    fig = dp.plot_scaling({1: 0.1, 2: 0.11, 4: 0.13}, pred)
    e_ax = fig.axes[1]
    assert e_ax.lines[0].get_ydata()[0] == 1.0
    assert e_ax.lines[0].get_ydata()[2] == pytest.approx(0.1 / 0.13)


def test_experiment_plots() -> None:
    """Bucket sweep (two axes), stale-SGD curves (labelled simulation), duplicates grid."""
    fig = dp.plot_bucket_sweep([0.1, 1, 25], [0.05, 0.04, 0.06], [0.2, 0.5, 0.0])
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 1
    fig = dp.plot_stale_sgd({0: [2.0, 1.0], 4: [2.0, 1.5]})
    assert "SIMULATION" in fig.axes[0].get_title() and len(fig.axes[0].lines) == 2
    res = [{"rank": r, "epochs": [[0, 1, 2, 3]]} for r in range(2)]
    fig = dp.plot_duplicates(res)
    assert "4 of 4 samples" in fig.axes[0].get_title()
    assert (fig.axes[0].images[0].get_array() == 2).all()  # every cell: loaded twice


def test_duplicates_show_the_mistake_beside_the_correct_case_with_a_legend() -> None:
    """Two panels, the sampler-less ranks (every sample twice, red) over the sharded ones
    (each sample once, blue); a legend names both colours; ticks are sample ids."""
    twice = [{"rank": r, "epochs": [[0, 1, 2, 3]]} for r in range(2)]
    once = [{"rank": 0, "epochs": [[0, 2]]}, {"rank": 1, "epochs": [[1, 3]]}]
    fig = dp.plot_duplicates({"no sampler": twice, "DistributedSampler": once})
    top, bottom = fig.axes
    assert "no sampler" in top.get_title() and "0 of 4 samples" in bottom.get_title()
    grid = bottom.images[0].get_array()
    assert grid.tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]
    labels = [t.get_text() for t in top.get_legend().get_texts()]
    assert labels == ["loaded by this rank only", "loaded by another rank too"]
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["0", "1", "2", "3"]


def test_the_roofline_draws_the_fitted_floor_line_when_given() -> None:
    """Measured compute and all-reduce, and the floor + slope dotted through the batch range."""
    plain = dp.plot_roofline([4, 32, 256, 1024], [3e-3, 5e-3, 23e-3, 93e-3], [2e-3] * 4, 11.0)
    with_model = dp.plot_roofline([4, 32, 256, 1024], [3e-3, 5e-3, 23e-3, 93e-3], [2e-3] * 4,
                                  11.0, model=(2.8e-3, 0.078e-3))
    assert len(with_model.axes[0].lines) == len(plain.axes[0].lines) + 1
    line = with_model.axes[0].lines[2]
    assert line.get_label() == "floor 2.80 ms + 0.078 ms a sample"
    assert line.get_ydata()[0] == pytest.approx(2.8e-3 + 4 * 0.078e-3)
    assert line.get_xdata()[-1] == pytest.approx(1024)
