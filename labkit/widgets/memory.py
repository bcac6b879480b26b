"""An ipywidgets explorer over the memory calculator (``labkit.theory.fits``).

Move the sliders (parameters, GPUs, GPU size, ZeRO stage, precision, optimizer, tensor /
pipeline degrees, activation memory) and read whether training fits, with the binding
term named and a bar of the per-GPU bytes. Pure prediction: no process is started.
"""

from __future__ import annotations

from typing import Any

from labkit.errors import ConfigError
from labkit.theory import fits
from labkit.theory.memory import MEMORY_TERMS


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


def memory_explorer(params: float = 3e9, gpus: int = 4, gpu_gb: float = 24.0) -> Any:
    """Sliders over ``fits``; defaults are the seeds' exercise (3B params, 4 x 24 GB)."""
    import ipywidgets as w
    from IPython.display import display

    controls = {
        "params_b": w.FloatLogSlider(value=params / 1e9, base=10, min=-1, max=3, step=0.05,
                                     description="params (B)"),
        "gpus": w.IntSlider(value=gpus, min=1, max=512, description="GPUs"),
        "gpu_gb": w.FloatSlider(value=gpu_gb, min=8, max=192, step=8, description="GB / GPU"),
        "stage": w.IntSlider(value=0, min=0, max=3, description="ZeRO stage"),
        "precision": w.Dropdown(options=["mixed", "fp32"], value="mixed",
                                description="precision"),
        "optimizer": w.Dropdown(options=["adam", "momentum", "sgd"], value="adam",
                                description="optimizer"),
        "tp": w.IntSlider(value=1, min=1, max=8, description="tensor par."),
        "pp": w.IntSlider(value=1, min=1, max=8, description="pipeline par."),
        "activation_gb": w.FloatSlider(value=0.0, min=0, max=80, step=0.5,
                                       description="activ. GB"),
    }
    out = w.Output()

    def update(**kw: Any) -> None:
        out.clear_output(wait=True)
        with out:
            try:
                report = fits(kw["params_b"] * 1e9, gpus=kw["gpus"], gpu_gb=kw["gpu_gb"],
                              stage=kw["stage"], precision=kw["precision"],
                              optimizer=kw["optimizer"], tp=kw["tp"], pp=kw["pp"],
                              activation_gb=kw["activation_gb"])
            except ConfigError as err:
                print(err)
                return
            print(report.explanation)
            display(memory_figure(report))

    w.interactive_output(update, controls)
    return w.VBox([w.HBox([w.VBox(list(controls.values())[:5]),
                           w.VBox(list(controls.values())[5:])]), out])
