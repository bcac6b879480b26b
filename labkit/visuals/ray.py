"""Lesson 12 figure: what ran where in a Ray program.

``plot_ray_calls`` draws every remote call ``labkit.lessons.ray_tasks.actor_parameter_server``
recorded: a row per process (the actor's, then each worker process Ray ran tasks in), a bar
per call from its start to its end on the host's monotonic clock. Gradient tasks are
coloured by the logical worker they computed for: a logical worker is not a process, and
Ray runs its tasks wherever a worker process is free.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from labkit.analysis.plots import new_figure

_WORKER_COLORS = ("#4C9BE8", "#F28E2B", "#B07AA1", "#76B7B2", "#EDC948")


def plot_ray_calls(run: Any, title: str | None = None) -> Figure:
    """Rows = processes, bars = calls (actor: pull / apply; tasks: one gradient each)."""
    calls = run.calls
    t0 = min(c.start_ns for c in calls)
    thin = (max(c.end_ns for c in calls) - t0) / 1e6 / 300  # short calls stay visible
    pids = [run.actor_pid] + sorted({c.pid for c in calls} - {run.actor_pid})
    fig = new_figure((11, 0.9 + 0.55 * len(pids)))
    ax = fig.subplots()
    for c in calls:
        row = pids.index(c.pid)
        color = ("#59A14F" if c.what == "apply" else "#BAB0AC" if c.what == "pull"
                 else _WORKER_COLORS[(c.worker or 0) % len(_WORKER_COLORS)])
        ax.broken_barh([((c.start_ns - t0) / 1e6, max((c.end_ns - c.start_ns) / 1e6, thin))],
                       (row + 0.1, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
    ax.set_yticks([i + 0.5 for i in range(len(pids))])
    ax.set_yticklabels([f"actor (server), pid {p}" if i == 0 else f"worker process, pid {p}"
                        for i, p in enumerate(pids)])
    ax.set_ylim(len(pids), 0)
    ax.set_xlabel("ms since the first call")
    from matplotlib.patches import Patch

    workers = sorted({c.worker for c in calls if c.worker is not None})
    handles = [Patch(color=_WORKER_COLORS[w % len(_WORKER_COLORS)], label=f"gradient, worker {w}")
               for w in workers] + [Patch(color="#BAB0AC", label="pull"),
                                    Patch(color="#59A14F", label="apply")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    ax.set_title(title or ("BSP" if run.sync else "ASP") + " with a Ray actor and Ray tasks")
    fig.tight_layout()
    return fig
