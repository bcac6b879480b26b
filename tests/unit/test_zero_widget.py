"""The memory explorer builds and its figure shows the calculator's per-GPU bytes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.theory import fits
from labkit.widgets.memory import memory_explorer, memory_figure

pytestmark = pytest.mark.lesson05


def test_memory_figure_stacks_the_four_terms_against_capacity() -> None:
    report = fits(3e9, gpus=4, gpu_gb=24, stage=3, activation_gb=2.0)
    fig = memory_figure(report)
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert widths == pytest.approx([1.5, 1.5, 9.0, 2.0])
    assert fig.axes[0].get_lines()[0].get_xdata()[0] == pytest.approx(24.0)


def test_memory_explorer_builds_with_the_seed_defaults() -> None:
    box = memory_explorer()
    assert len(box.children) == 2


class FakeZeroRunner:
    """Answers ``run(**kw)`` with the metrics a ZeRO run reports (bytes shrink with stage)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def run(self, **kw: object) -> object:
        from types import SimpleNamespace

        self.calls.append(kw)
        stage = kw["options"]["stage"]  # type: ignore[index]
        per_rank = {"params": 400, "grads": 400, "optimizer": 800 // (2 if stage else 1)}
        return SimpleNamespace(metrics={
            "per_rank_bytes": [per_rank, per_rank], "num_params": 100,
            "predicted_bytes": {"params": 400, "grads": 400, "optimizer": per_rank["optimizer"]}})


def test_measured_explorer_reruns_on_the_runner_as_controls_move() -> None:
    """The calculator's own stage / precision / optimizer controls drive a real-run panel:
    stage 0 (the baseline) and the chosen stage, each measured once and then cached."""
    from labkit.widgets.memory import MeasuredMemoryPanel

    runner = FakeZeroRunner()
    box = memory_explorer(measure=True, runner=runner)
    assert len(box.children) == 2
    assert [c["options"] for c in runner.calls] == [{"stage": 0, "precision": "bf16"}]
    calc = box.children[0].children[0]
    stage = calc.children[0].children[3]
    stage.value = 2  # no event loop here: the debounced rerun happens at once
    assert runner.calls[-1]["options"] == {"stage": 2, "precision": "bf16"}
    assert runner.calls[-1]["world_size"] == 2 and runner.calls[-1]["strategy"] == "zero"
    stage.value = 0
    stage.value = 2
    assert len(runner.calls) == 2  # both measured already: nothing reruns
    panel = MeasuredMemoryPanel(stage, calc.children[0].children[4],
                                calc.children[1].children[0], runner=runner)
    panel.width.value = 128
    assert runner.calls[-1]["model"].width == 128
    assert "rank 0 keeps <b>1.2 kB</b>" in panel.status.value


def test_measured_panel_says_when_the_calculator_splits_over_other_gpus() -> None:
    """The calculator's GPUs slider and the ranks measured can differ (4 GPUs predicted, 2
    ranks on a laptop): the measured panel names both counts, and follows the slider."""
    box = memory_explorer(gpus=4, measure=True, runner=FakeZeroRunner())
    head = box.children[1].children[0]
    assert "2 warm ranks" in head.value and "splits over 4 GPUs" in head.value
    gpus = box.children[0].children[0].children[0].children[1]
    gpus.value = 2
    assert "splits over" not in head.value and "2 warm ranks" in head.value


def test_explorer_activations_default_to_a_3b_gpt_not_zero() -> None:
    """Issue 33: the explorer's activations start from the seed model's shape (seq 2048,
    micro-batch 1, no recomputation: 30.6 GB), or from problem set 2's 6 GB without one."""
    from labkit.theory import GPT_3B, model_activation_bytes

    calc = memory_explorer()  # without measure=True: the calculator itself
    names = [c.description for col in calc.children[0].children for c in col.children]
    assert {"sequence length", "micro-batch", "recompute"} <= set(names)
    assert "activations GB" not in names
    assert model_activation_bytes(GPT_3B) / 1e9 == pytest.approx(30.6, abs=0.05)
    bare = memory_explorer(shape=None)
    sliders = {c.description: c.value for col in bare.children[0].children for c in col.children}
    assert sliders["activations GB"] == 6.0
