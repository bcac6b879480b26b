"""The memory explorer of lesson 05: the calculator, and the same rules measured live.

Top: the memory calculator (``labkit.theory.fits``). Move the sliders (parameters, GPUs,
GPU size, ZeRO stage, precision, optimizer, tensor / pipeline degrees, and the activations:
sequence length, micro-batch and recomputation of a transformer's shape, Korthikanti et al.
2022, or an activation size of your own) and read whether training fits, with the binding
term named and a bar of the per-GPU bytes. Pure prediction.

Bottom (``measure=True``): the same ZeRO stage, precision and optimizer -- the very same
controls -- applied to a small model trained for real by ``labkit run zero`` on the
kernel's warm pool (``labkit.pool``). Every change reruns it, debounced (one run once the
controls rest, ``labkit.widgets.live``), and redraws measured bytes per rank beside the
prediction (``labkit.visuals.memory.plot_memory_bars``), with plain data parallelism
(stage 0) of the same model as the baseline. A run takes well under a second on warm ranks.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from labkit.base.errors import ConfigError
from labkit.theory import TransformerShape, fits
from labkit.theory.activations import GPT_3B, RECOMPUTE
from labkit.theory.memory import MEMORY_TERMS
from labkit.widgets.live import Debouncer, FigureView, timed_run, warm_runner

RUN_PRECISION = {"mixed": "bf16", "fp32": "fp32"}
"""The calculator's precision -> the precision option of ``labkit run zero``."""


def memory_figure(report: Any) -> Any:
    """A one-bar stacked chart of a ``FitReport`` against the GPU's capacity (GB)."""
    import matplotlib.pyplot as plt

    from labkit.visuals.memory import TERM_COLORS

    fig, ax = plt.subplots(figsize=(6, 1.8))
    left = 0.0
    for term in MEMORY_TERMS:
        width = report.per_gpu_bytes[term] / 1e9
        ax.barh(0, width, left=left, color=TERM_COLORS[term], label=term)
        left += width
    ax.axvline(report.capacity_bytes / 1e9, color="black", linestyle="--", label="GPU capacity")
    ax.set_yticks([])
    ax.set_xlabel("GB per GPU (1 GB = 1e9 B)")
    ax.legend(fontsize=7, frameon=False, ncol=5, loc="upper center", bbox_to_anchor=(0.5, 1.5))
    fig.tight_layout()
    plt.close(fig)
    return fig


def memory_explorer(params: float = 3e9, gpus: int = 4, gpu_gb: float = 24.0, *,
                    shape: TransformerShape | None = GPT_3B, activation_gb: float = 6.0,
                    measure: bool = False, runner: Any = None, world_size: int = 2) -> Any:
    """Sliders over ``fits``; defaults are the seeds' exercise (3B params, 4 x 24 GB).

    Activations come from ``shape`` (default: a 3B GPT, 36 layers of width 2560; its
    sequence length, micro-batch and recomputation are controls; they do not follow the
    parameter slider) or, with ``shape=None``, from a slider starting at ``activation_gb``
    (problem set 2's estimate for the seed's exercise).
    ``measure=True`` adds the live measurement (see the module docstring) on ``runner``
    (default: the kernel's ``labkit.pool(world_size)``).
    """
    import ipywidgets as w
    from IPython.display import display

    # one event when the hand lets go; room for the longest description, never cut short
    slider = {"continuous_update": False, "style": {"description_width": "125px"}}
    label = {"style": {"description_width": "125px"}}
    controls = {
        "params_b": w.FloatLogSlider(value=params / 1e9, base=10, min=-1, max=3, step=0.05,
                                     description="params (B)", **slider),
        "gpus": w.IntSlider(value=gpus, min=1, max=512, description="GPUs", **slider),
        "gpu_gb": w.FloatSlider(value=gpu_gb, min=8, max=192, step=8, description="GB / GPU",
                                **slider),
        "stage": w.IntSlider(value=0, min=0, max=3, description="ZeRO stage", **slider),
        "precision": w.Dropdown(options=["mixed", "fp32"], value="mixed",
                                description="precision", **label),
        "optimizer": w.Dropdown(options=["adam", "momentum", "sgd"], value="adam",
                                description="optimizer", **label),
        "tp": w.IntSlider(value=1, min=1, max=8, description="tensor parallel", **slider),
        "pp": w.IntSlider(value=1, min=1, max=8, description="pipeline parallel", **slider),
    }
    if shape is None:
        controls["activation_gb"] = w.FloatSlider(value=activation_gb, min=0, max=80, step=0.5,
                                                  description="activations GB", **slider)
    else:
        controls |= {
            "seq": w.IntSlider(value=shape.seq, min=128, max=32768, step=128,
                               description="sequence length", **slider),
            "micro_batch": w.IntSlider(value=shape.micro_batch, min=1, max=32,
                                       description="micro-batch", **slider),
            "recompute": w.Dropdown(options=list(RECOMPUTE), value="none",
                                    description="recompute", **label)}
    out = w.Output()

    def update(**kw: Any) -> None:
        out.clear_output(wait=True)
        with out:
            try:
                acts: dict[str, Any] = (
                    {"activation_gb": kw["activation_gb"]} if shape is None else
                    {"shape": replace(shape, seq=kw["seq"], micro_batch=kw["micro_batch"]),
                     "recompute": kw["recompute"]})
                report = fits(kw["params_b"] * 1e9, gpus=kw["gpus"], gpu_gb=kw["gpu_gb"],
                              stage=kw["stage"], precision=kw["precision"],
                              optimizer=kw["optimizer"], tp=kw["tp"], pp=kw["pp"], **acts)
            except ConfigError as err:
                print(err)
                return
            if shape is not None:
                print(f"Activations of a GPT with {shape.layers} layers of width {shape.hidden}, "
                      f"{shape.heads} heads (Korthikanti et al. 2022), whatever the parameters.")
            print(report.explanation)
            display(memory_figure(report))

    w.interactive_output(update, controls)
    calculator = w.VBox([w.HBox([w.VBox(list(controls.values())[:5]),
                                 w.VBox(list(controls.values())[5:])]), out])
    if not measure:
        return calculator
    panel = MeasuredMemoryPanel(controls["stage"], controls["precision"],
                                controls["optimizer"], runner=runner, world_size=world_size,
                                gpus=controls["gpus"])
    return w.VBox([calculator, panel.widget])


class MeasuredMemoryPanel:
    """A small model trained with ``labkit run zero`` at the chosen stage, precision and
    optimizer; measured bytes per rank beside the prediction, rerun on every change."""

    def __init__(self, stage: Any, precision: Any, optimizer: Any, *, runner: Any = None,
                 world_size: int = 2, width: int = 256, depth: int = 2, gpus: Any = None,
                 **run_kwargs: Any):
        import ipywidgets as w

        self.stage, self.precision, self.optimizer = stage, precision, optimizer
        self.gpus = gpus
        """The calculator's GPUs control, if any: the header says when it differs from the
        ranks measured here (ZeRO's savings depend on the number of data-parallel ranks)."""
        self.head = w.HTML()
        self.width = w.IntSlider(value=width, min=64, max=1024, step=64,
                                 description="width", continuous_update=False)
        self.depth = w.IntSlider(value=depth, min=1, max=6, description="depth",
                                 continuous_update=False)
        self.world_size, self._runner = world_size, runner
        self.run_kwargs = {"steps": 2, "batch_size": 32, "lr": 0.01, "progress": False,
                           "timeout_s": 60, **run_kwargs}
        self.status = w.HTML()
        self.measured = FigureView()
        self.results: dict[tuple[Any, ...], Any] = {}
        self.rerun = Debouncer(self.run)
        for control in (stage, precision, optimizer, self.width, self.depth):
            control.observe(lambda _change: self.rerun.trigger(), names="value")
        if gpus is not None:
            gpus.observe(lambda _change: self._say_what_runs(), names="value")
        self._say_what_runs()
        self.run()

    def _say_what_runs(self) -> None:
        n = self.world_size
        head = (f"<b>Measured</b>: the stage, precision and optimizer above, on a small MLP "
                f"trained for real on <b>{n} warm ranks</b> (N<sub>d</sub> = {n}; filled: "
                f"measured, outline: the same formula at N<sub>d</sub> = {n}; left: stage 0 of "
                f"the same model)")
        if self.gpus is not None and self.gpus.value != n:
            head += (f".<br>The calculator above splits over {self.gpus.value} GPUs; this "
                     f"machine measures {n} ranks, so ZeRO's shares here are 1/{n}, not "
                     f"1/{self.gpus.value}.")
        self.head.value = head

    @property
    def widget(self) -> Any:
        import ipywidgets as w

        return w.VBox([self.head, w.HBox([self.width, self.depth]), self.status,
                       self.measured.widget])

    def _measure(self, stage: int) -> tuple[Any, float, str | None]:
        from labkit.config.run import ModelConfig

        key = (stage, self.precision.value, self.optimizer.value, self.width.value,
               self.depth.value)
        if key in self.results:
            return self.results[key], 0.0, None
        result, seconds, error = timed_run(
            warm_runner(self._runner, self.world_size), strategy="zero",
            world_size=self.world_size, optimizer=self.optimizer.value,
            model=ModelConfig(width=self.width.value, depth=self.depth.value),
            options={"stage": stage, "precision": RUN_PRECISION[self.precision.value]},
            **self.run_kwargs)
        if result is not None:
            self.results[key] = result
        return result, seconds, error

    def run(self) -> None:
        """Measure the chosen stage (and the stage-0 baseline once) and redraw."""
        from labkit.visuals.memory import plot_memory_bars

        stage = self.stage.value
        self.status.value = f"measuring stage {stage} on {self.world_size} warm ranks ..."
        t0 = time.monotonic()
        runs = {}
        for s in sorted({0, stage}):
            result, _seconds, error = self._measure(s)
            if error is not None:
                self.status.value = f"<span style='color:#c00'>the run failed: {error}</span>"
                return
            runs[f"stage {s}" + (" (DDP)" if s == 0 else "")] = result
        current = runs[next(reversed(runs))]
        kept = sum(current.metrics["per_rank_bytes"][0].values())
        predicted = sum(v for k, v in current.metrics["predicted_bytes"].items()
                        if k in ("params", "grads", "optimizer"))
        self.status.value = (
            f"stage {stage}, {self.precision.value}, {self.optimizer.value}, "
            f"{current.metrics['num_params']:,} params: rank 0 keeps <b>{kept / 1e3:.1f} kB"
            f"</b> of model states, predicted {predicted / 1e3:.1f} kB &nbsp; "
            f"(measured in {time.monotonic() - t0:.2f} s)")
        self.measured.show(plot_memory_bars(runs))
