"""Lesson 10's measurements: real runs across emulated nodes, each row beside its prediction.

Every function runs real ranks and returns plain rows (dicts) plus the ``RunResult`` objects
for plots; runs on one link share one torchrun job (``launcher.run_many``). Where this
machine cannot emulate nodes (``labkit.base.netsupport()``), the cross-node rows keep their
alpha-beta prediction from the preset, ``step_s`` is None and ``note`` says what the run
would have measured: the lesson still runs, top to bottom.

Conventions (``labkit.lessons.cluster_predict``): seconds per step, first step skipped; "exposed"
communication is what no compute hid; weak scaling (the same batch per rank), so the
scaling efficiency of n ranks is ``t(1 rank) / t(n ranks)``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from typing import Any

from labkit.base.netsupport import support
from labkit.base.progress import each, waiting
from labkit.config.links import LinkWarning, parse_link
from labkit.config.run import ModelConfig
from labkit.lessons import cluster_predict as predict
from labkit.lessons.cluster_ddp import IN_NODE, ONE
from labkit.lessons.cluster_text import RATE_TOLERANCE
from labkit.lessons.machine import load_now
from labkit.theory.interconnect import Interconnect

DDP_MODEL = ModelConfig(width=256, depth=4)
NOT_HERE = ("not measured: no emulated cluster on this machine ({why}); the cross-node rows "
            "hold the alpha-beta prediction from each preset's own rate and latency")


def _run(**kw: Any) -> Any:
    import labkit

    kw.setdefault("timeout_s", 180)
    kw.setdefault("progress", None)  # a bar once a run lasts 2 s (a cross-node run can)
    with warnings.catch_warnings():  # the rows say whether the latency was applied
        warnings.simplefilter("ignore", LinkWarning)
        return labkit.run(**kw)


def _key(config: dict[str, Any]) -> str:
    from labkit.config.run import RunConfig

    return json.dumps(RunConfig(**{"timeout_s": 180, "progress": False, **config}).to_json(),
                      sort_keys=True, default=str)


def _shape(config: dict[str, Any]) -> tuple[Any, ...]:
    return (config.get("nodes", 1), config.get("link"), config.get("world_size"))


_PLANNED: dict[str, dict[str, Any]] = {}
"""Configs a lesson will run later (``share_startup``), by key: they ride along with the
first job on their nodes and link."""
_AHEAD: dict[str, Any] = {}
"""Results of planned configs that ran ahead, by key, each handed over once."""


def share_startup(*config_lists: Sequence[dict[str, Any]]) -> int:
    """Plan runs a lesson makes later, so that they share the start-up of the first job on
    the same emulated nodes and link (``launcher.run_many``: one torchrun job, one link probe).

    Starting emulated nodes costs seconds, every time: each node's torchrun agent and each
    rank is a fresh Python that imports torch. A planned run executes with the first job of
    its shape; its result is handed over, once, when the lesson asks for that exact config
    (asked again, it runs again). Returns how many runs are planned."""
    for configs in config_lists:
        for c in configs:
            if c.get("nodes", 1) > 1:
                _PLANNED[_key(c)] = dict(c)
    return len(_PLANNED)


def _run_many(configs: list[dict[str, Any]]) -> list[Any]:
    """One torchrun job for all ``configs`` (same nodes, link, world size) and the planned
    runs of the same shape that have not run yet; without an emulated cluster, configs run
    one by one under ``labkit.run``."""
    from labkit.config.run import RunConfig
    from labkit.launchers.cluster.launcher import run_many

    if not support().available:
        return [_run(**c) for c in configs]
    keys = [_key(c) for c in configs]
    todo = {k: c for k, c in zip(keys, configs) if k not in _AHEAD}
    if todo:
        shape = _shape(next(iter(todo.values())))
        riders = {k: c for k, c in _PLANNED.items() if _shape(c) == shape and k not in todo}
        batch = {**todo, **riders}
        nodes, link, _ = shape
        with warnings.catch_warnings(), waiting(
                f"{len(batch)} run(s) on {nodes} emulated nodes over {link or 'an unshaped link'} "
                f"(namespaces, links and one torchrun agent per node start first)", after_s=2.0):
            warnings.simplefilter("ignore", LinkWarning)
            results = run_many([RunConfig(**{"timeout_s": 180, "progress": False, **c})
                                for c in batch.values()])
        for k, r in zip(batch, results):
            _PLANNED.pop(k, None)
            _AHEAD[k] = r
    return [_AHEAD.pop(k) for k in keys]


def measure_loopback(sizes: Sequence[str] = ("16KB", "64KB", "256KB", "1MB"),
                     iters: int = 8) -> Any:
    """The wire inside one node: an all-reduce benchmark on 2 ranks over loopback (gloo),
    fitted to the alpha-beta line. The ``RunResult``; ``cluster_predict.loopback_model``
    turns it into the link every cross-node prediction compares against."""
    return _run(strategy="allreduce-bench", world_size=2, threads_per_rank=1,
                options={"impl": "builtin", "sizes": tuple(sizes), "iters": iters})


def _missing(link: str) -> str:
    """Why a row over ``link`` holds only its prediction (the same words for every link)."""
    parse_link(link)  # a bad spec still fails loudly
    return NOT_HERE.format(why=support().reason)


def measure_links(links: Sequence[str] = ("infiniband_hdr", "ethernet_100g", "ethernet_25g")
                  ) -> list[dict[str, Any]]:
    """The link itself: shaped rate and latency beside what the probe measured. A row whose
    goodput sits more than ``RATE_TOLERANCE`` from the rate also holds ``load``: how busy
    other programs kept the machine just after its probe (``cluster_text.link_text`` says it)."""
    from labkit.launchers.cluster.launcher import measure_link

    rows = []
    for text in each(list(links), "measuring shaped links", unit="link"):
        spec = parse_link(text)
        row: dict[str, Any] = {"link": text, **spec.to_json(), "measured_bps": None,
                               "measured_latency_s": None, "rate_error": None}
        if support().available:
            row.update(measure_link(text))
            row["rate_error"] = row["measured_bps"] / spec.rate_bps - 1
            if abs(row["rate_error"]) > RATE_TOLERANCE:  # read now, while it still matters
                row["load"] = load_now(fresh=True)
        else:
            row["note"] = _missing(text)
        rows.append(row)
    return rows


def ddp_across_links(links: Sequence[str] = ("infiniband_hdr", "ethernet_25g"), *,
                     steps: int = 8, batch_size: int = 256, model: ModelConfig = DDP_MODEL,
                     loopback: Interconnect | None = None, **run_kw: Any) -> dict[str, Any]:
    """DDP on 1 rank, on 1 node of 2 ranks (loopback) and on 2 nodes of 1 rank per link.

    Rows: ``name``, ``nodes``, ``link``, ``step_s``, ``compute_s``, ``exposed_s``,
    ``efficiency`` (t1 / t), ``predicted_comm_s`` (the all-reduce on the link, alpha-beta),
    ``predicted_step_s`` (the step measured on one node + what the link adds to the
    all-reduce beyond loopback, ``cluster_predict.extra_link``: never below the one-node
    step) and ``error`` (measured / predicted - 1). ``loopback``: the in-node wire
    (measured with ``measure_loopback`` when not given).
    """
    kw = dict(strategy="ddp", steps=steps, batch_size=batch_size, model=model,
              threads_per_rank=1, **run_kw)
    loop_link = loopback or predict.loopback_model(measure_loopback())
    # 1. the compute-only reference
    one = _run(world_size=1, **kw)
    t1 = predict.step_parts(one)["step_s"]
    # 2. one node: loopback between the ranks
    loop = _run(world_size=2, **kw)
    grad_bytes = float(loop.metrics["bytes_per_step"])
    rows = [_ddp_row(ONE, 1, None, one, t1), _ddp_row(IN_NODE, 1, None, loop, t1)]
    results = {ONE: one, IN_NODE: loop}
    inside = predict.step_parts(loop)["step_s"]
    # 3. two nodes, one rank each, per link
    for link in links:
        name = f"2 nodes x 1 rank, {link}"
        if support().available:
            (r,) = _run_many([dict(world_size=2, nodes=2, link=link, **kw)])
            row = _ddp_row(name, 2, link, r, t1)
            model_link = predict.link_model(r.metrics["link"])
            results[name] = r
        else:
            row = {"name": name, "nodes": 2, "link": link, "step_s": None, "note": _missing(link)}
            model_link = predict.link_model(parse_link(link))
        extra = predict.allreduce_s(grad_bytes, 2, predict.extra_link(model_link, loop_link))
        pred = inside + extra
        row.update(predicted_comm_s=predict.allreduce_s(grad_bytes, 2, model_link),
                   predicted_step_s=pred,
                   error=None if row["step_s"] is None else row["step_s"] / pred - 1)
        rows.append(row)
    return {"rows": rows, "results": results, "grad_bytes": grad_bytes, "t1_s": t1,
            "loopback": loop_link}


def _ddp_row(name: str, nodes: int, link: str | None, result: Any, t1: float) -> dict[str, Any]:
    parts = predict.step_parts(result)
    return {"name": name, "nodes": nodes, "link": link, **parts,
            "efficiency": t1 / parts["step_s"] if parts["step_s"] else None,
            "exposed_share": parts["exposed_s"] / parts["step_s"] if parts["step_s"] else None,
            "predicted_comm_s": None, "predicted_step_s": None, "error": None}


def overhead_inside_vs_across(ddp: dict[str, Any], link: str | None = None) -> dict[str, Any]:
    """Seed 001's FAQ ("5-15% inside a node, 15-30% across") as this machine measured it:
    the share of the DDP step spent in exposed communication, inside one node and across
    ``link`` (default: the first link measured). ``runs``: the two runs behind the shares
    (inside, across), for the replay a missed verdict draws."""
    rows = ddp["rows"]
    inside = next(r for r in rows if r["name"].startswith("1 node"))
    across = next(r for r in rows if r["nodes"] == 2 and (link is None or r["link"] == link))
    share = across.get("exposed_share")
    if share is None and across.get("predicted_step_s"):
        share = across["predicted_comm_s"] / across["predicted_step_s"]
    return {"inside": inside["exposed_share"], "across": share, "link": across["link"],
            "faq_inside": (0.05, 0.15), "faq_across": (0.15, 0.30),
            "measured": across["step_s"] is not None,
            "runs": {k: ddp["results"][r["name"]] for k, r in (("inside", inside),
                                                               ("across", across))
                     if r["name"] in ddp.get("results", {})}}


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned text: seconds shown in ms (``*_s``), bits/s in Mbit/s (``*_bps``),
    shares and errors in %, missing values as '-'; each row's ``note`` once, below."""
    def cell(key: str, v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            if key.endswith("_s"):
                return f"{v * 1e3:.2f} ms"
            if key.endswith("_bps"):
                return f"{v / 1e6:.1f} Mbit/s"
            if key in ("error", "rate_error", "efficiency", "exposed_share"):
                return f"{v:+.1%}" if "error" in key else f"{v:.0%}"
            return f"{v:.3g}"
        return str(v)

    grid = [list(columns)] + [[cell(c, r.get(c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in grid]
    notes = dict.fromkeys(r["note"] for r in rows if r.get("note"))  # once each, in order
    return "\n".join(lines + [f"note: {n}" for n in notes])
