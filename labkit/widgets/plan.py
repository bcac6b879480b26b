"""The planner explorer of lesson 13: pick a model and a cluster, read the ranked layouts.

Teaches what ``labkit.theory.plan`` does at a glance: choose a model preset, a GPU, the
GPU count, the sequence length and the global batch (tokens), press *Plan*, and read the
ranked table (one row per dp x tp x pp, its memory per GPU, step time, tokens/s per GPU, MFU
and binding term), the memory and time of the top layouts as stacked bars
(``labkit.visuals.plan.plot_plan_breakdown``), and why the layouts that lose do (out of
memory, TP across nodes, the bubble, a DP reduction on the slow link).

Planning is pure arithmetic (no ranks), so the widget takes a ``planner`` (anything called
like ``labkit.theory.plan.plan(model, cluster, training)``): unit tests pass a stand-in.
A bad input is shown in the widget, never raised out of a callback.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from labkit.base.errors import LabError
from labkit.widgets.live import FigureView

TOP = 5
"""Rows of the ranked table and bars of the figure (the best layouts)."""


def _table(preds: list[Any], top: int) -> str:
    from labkit.theory.plan import by_shape

    head = ("<tr><th>#</th><th>layout</th><th>GB/GPU</th><th>step s</th><th>tok/s/GPU</th>"
            "<th>MFU</th><th>binding</th></tr>")
    rows = [f"<tr><td>{i}</td><td>{html.escape(q.layout.label())}</td>"
            f"<td>{q.memory_bytes / 1e9:.1f}</td><td>{q.step_s:.3g}</td>"
            f"<td>{q.tokens_per_s_per_gpu:,.0f}</td><td>{q.mfu:.1%}</td>"
            f"<td>{html.escape(q.binding)}</td></tr>"
            for i, q in enumerate(by_shape(preds)[:top], 1)]
    return f"<table style='font-size:12px'>{head}{''.join(rows)}</table>"


def losers_text(preds: list[Any]) -> str:
    """Why the layouts that lose do: how many shapes each binding term stops, worst first."""
    from labkit.theory.plan import by_shape

    shapes = by_shape(preds)
    counts: dict[str, int] = {}
    for q in shapes[1:]:
        kind = q.binding.split(" (")[0].split(":")[0]
        counts[kind] = counts.get(kind, 0) + 1
    parts = [f"{n} x {kind}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return (f"{len(shapes)} shapes, {sum(q.fits for q in shapes)} fit. What binds the rest: "
            + ", ".join(parts) + ".")


def plan_explorer(model: str = "llama3-70b", gpu: str = "h100-sxm", gpus: int = 1024,
                  seq: int = 8192, global_batch_tokens: float = 2048 * 8192, *, top: int = TOP,
                  planner: Callable[..., list[Any]] | None = None) -> Any:
    """Dropdowns for the model and GPU presets, boxes for the GPU count, sequence length and
    global batch, a *Plan* button; below, the ranked table, the bars and the losers' reasons."""
    import ipywidgets as w

    from labkit.theory.plan import plan
    from labkit.theory.plan_models import GPUS, MODELS, Training, cluster, get_model
    from labkit.visuals.plan import plot_plan_breakdown

    run_plan = planner or plan
    model_box = w.Dropdown(options=list(MODELS), value=model, description="model")
    gpu_box = w.Dropdown(options=list(GPUS), value=gpu, description="GPU")
    gpus_box = w.IntText(value=gpus, description="GPUs")
    seq_box = w.IntText(value=seq, description="sequence")
    batch_box = w.FloatText(value=global_batch_tokens, description="batch tokens")
    button = w.Button(description="Plan", button_style="primary")
    table, reasons = w.HTML(), w.HTML()
    view = FigureView("The bars appear after the first plan.")

    def refresh(_: Any = None) -> None:
        try:
            decoder = get_model(model_box.value).with_seq(int(seq_box.value))
            net = cluster(gpu_box.value, int(gpus_box.value))
            preds = run_plan(decoder, net, Training(global_batch_tokens=float(batch_box.value)))
        except LabError as err:
            table.value = f"<b style='color:#B22222'>{html.escape(str(err))}</b>"
            reasons.value = ""
            view.clear()
            return
        from labkit.theory.plan import by_shape

        table.value = _table(preds, top)
        reasons.value = f"<p>{html.escape(losers_text(preds))}</p>"
        best = {f"#{i} DP{q.layout.dp} TP{q.layout.tp} PP{q.layout.pp}": q
                for i, q in enumerate(by_shape(preds)[:top], 1)}
        view.show(plot_plan_breakdown(best, title=f"{model_box.value} on {net.gpus} "
                                                  f"{gpu_box.value}"))

    button.on_click(refresh)
    controls = w.VBox([w.HBox([model_box, gpu_box, gpus_box]),
                       w.HBox([seq_box, batch_box, button])])
    box = w.VBox([controls, table, reasons, view.widget])
    box.refresh = refresh  # type: ignore[attr-defined]
    refresh()
    return box
