"""Lesson 10, second half: where to put each kind of communication (``experiments`` re-exports).

* ``placement``: seed 003's rule "tensor parallel inside a node, pipeline across nodes",
  measured: the same amount of model work as TP and as a 2-stage pipeline, each inside one
  node (loopback, under labkit's own launcher) and across the slow link;
* ``hierarchical_vs_flat``: a flat ring over 4 ranks on 2 nodes against the hierarchical
  all-reduce (``labkit.strategies.collectives.hierarchical``);
* ``compression_on_link``: DDP gradient compression on loopback, where the bytes are cheap,
  and on a slow link, where they are the step.
Rows carry the alpha-beta prediction beside the measurement (``labkit.lessons.cluster_predict``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.base.netsupport import support
from labkit.config.links import parse_link
from labkit.config.run import ModelConfig
from labkit.lessons import cluster_predict as predict
from labkit.lessons.cluster import DDP_MODEL, _missing, _run, _run_many, measure_loopback
from labkit.strategies.collectives import parse_size
from labkit.strategies.pipeline import pipeline_model
from labkit.theory.comm import alpha_beta_time
from labkit.theory.interconnect import Interconnect, predict_step_time

# The same model work both ways: 4 transformer blocks of hidden 256 (3.1M parameters, 12 h^2
# each) on 4 x 8 = 32 tokens, and a 12-layer MLP of width 512 (3.1M parameters) on 32 samples.
TP = {"hidden": 256, "heads": 4, "seq": 8, "layers": 4, "block": "both"}
TP_BATCH = 4
PP_MODEL = pipeline_model(512, 12)
PP_BATCH = 32


def placement_configs(link: str = "ethernet_25g", *, steps: int = 8, microbatches: int = 4,
                      tp: dict[str, Any] | None = None, tp_batch: int = TP_BATCH,
                      pp_model: ModelConfig = PP_MODEL, pp_batch: int = PP_BATCH
                      ) -> list[dict[str, Any]]:
    """The two runs of ``placement`` across ``link`` (TP, then the pipeline), as configs:
    what ``cluster.share_startup`` plans ahead."""
    opts = {**TP, **(tp or {})}
    return [dict(strategy="tp", world_size=2, steps=steps, batch_size=tp_batch, options=opts,
                 threads_per_rank=1, nodes=2, link=link),
            dict(strategy="pipeline", world_size=2, steps=steps, batch_size=pp_batch,
                 model=pp_model, options={"microbatches": microbatches}, threads_per_rank=1,
                 nodes=2, link=link)]


def placement(link: str = "ethernet_25g", *, loopback: Interconnect | None = None,
              **sizes: Any) -> dict[str, Any]:
    """TP and a 2-stage pipeline on about the same model work, inside one node and across
    ``link`` (``sizes``: the keywords of ``placement_configs``).

    Rows: ``strategy``, ``where``, ``step_s``, ``flops_per_step``, ``link_bytes_per_step``
    (what rank 0 sent per step), ``exposed_s``, ``wire_comm_s`` (the communication the wire
    needs, alpha-beta), ``contention`` (measured communication / ``wire_comm_s`` where that
    is at least ``cluster_predict.CONTENDED``: the ranks mostly waited for a core),
    ``predicted_step_s`` (across: the step measured inside the node + what the link adds to
    every message beyond loopback; never below the step inside) and ``slowdown`` (across /
    inside, measured and predicted).
    """
    across_cfgs = placement_configs(link, **sizes)
    inside_cfgs = [{k: v for k, v in c.items() if k not in ("nodes", "link")}
                   for c in across_cfgs]
    loop_link = loopback or predict.loopback_model(measure_loopback())
    inside = {c["strategy"]: _run(**c) for c in inside_cfgs}
    across: dict[str, Any] = {}
    if support().available:
        runs = _run_many(across_cfgs)
        across = dict(zip(("tp", "pipeline"), runs))
        model_link = predict.link_model(runs[0].metrics["link"])
    else:
        model_link = predict.link_model(parse_link(link))
    rows = []
    for cfg, (name, r_in) in zip(across_cfgs, inside.items()):
        parts = predict.step_parts(r_in)
        wire_in = _comm_cost(cfg, loop_link)
        extra = _comm_cost(cfg, predict.extra_link(model_link, loop_link))
        pred = parts["step_s"] + extra
        row_in = _place_row(name, "inside one node", r_in, None, wire_in)
        rows.append(row_in)
        r_out = across.get(name)
        row = _place_row(name, f"across {link}", r_out, pred, _comm_cost(cfg, model_link))
        if r_out is None:
            row["note"] = _missing(link)
        else:
            row["slowdown"] = row["step_s"] / row_in["step_s"]
        row["predicted_slowdown"] = pred / parts["step_s"]
        rows.append(row)
    return {"rows": rows, "inside": inside, "across": across, "loopback": loop_link,
            "link": model_link}


def _comm_cost(cfg: dict[str, Any], link: Interconnect) -> float:
    """Seconds of a step's communication on ``link`` (``labkit.theory.predict_step_time``):
    TP's 4 all-reduces per block on the critical path; the pipeline's (m + p - 1) slots
    each grown by two messages (GPipe / 1F1B)."""
    if cfg["strategy"] == "tp":
        tp = cfg["options"]
        return predict_step_time("tp", compute_s=0.0, world_size=2, link=link,
                                 bytes_per_value=4, batch=cfg["batch_size"], seq=tp["seq"],
                                 hidden=tp["hidden"], layers=tp["layers"]).comm_s
    m = cfg["options"]["microbatches"]
    free = Interconnect("free", 0.0, predict.FREE_BPS, "intra-node")
    kw = dict(compute_s=0.0, world_size=2, bytes_per_value=4, batch=cfg["batch_size"] // m,
              seq=1, hidden=cfg["model"].width, microbatches=m)
    return (predict_step_time("pp", link=link, **kw).total_s  # type: ignore[arg-type]
            - predict_step_time("pp", link=free, **kw).total_s)  # type: ignore[arg-type]


def _place_row(name: str, where: str, result: Any, predicted: float | None,
               wire_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"strategy": name, "where": where, "predicted_step_s": predicted,
                           "step_s": None, "slowdown": None, "wire_comm_s": wire_s,
                           "contention": None}
    if result is not None:
        parts = predict.step_parts(result)
        row.update(step_s=parts["step_s"], exposed_s=parts["exposed_s"],
                   flops_per_step=result.metrics.get("flops_per_step"),
                   link_bytes_per_step=predict.comm_events_bytes(result),
                   contention=predict.contention(parts["exposed_s"], wire_s))
    return row


def hierarchical_vs_flat(link: str = "ethernet_100g", *, sizes: Sequence[str] = ("1MB", "4MB"),
                         iters: int = 3, impls: Sequence[str] = ("ring", "hierarchical")
                         ) -> dict[str, Any]:
    """All-reduce on 2 nodes x 2 ranks: each impl's time per size beside the prediction."""
    sizes_b = [parse_size(s) for s in sizes]
    cfgs = [dict(strategy="allreduce-bench", world_size=4, nodes=2, link=link, steps=1,
                 threads_per_rank=1, options={"impl": impl, "sizes": tuple(sizes),
                                              "iters": iters, "warmup": 1}) for impl in impls]
    results: dict[str, Any] = {}
    if support().available:
        results = dict(zip(impls, _run_many(cfgs)))
        model_link = predict.link_model(next(iter(results.values())).metrics["link"])
    else:
        model_link = predict.link_model(parse_link(link))
    rows = []
    for impl in impls:
        measured = results[impl].metrics["results"] if impl in results else [None] * len(sizes_b)
        for size, m in zip(sizes_b, measured):
            pred = predict.flat_vs_hierarchical(size, 2, 2, model_link)
            key = "hierarchical_s" if impl == "hierarchical" else "flat_s"
            row = {"impl": impl, "bytes": size, "time_s": m["time_s"] if m else None,
                   "busbw_gbps": m["busbw_gbps"] if m else None, "predicted_s": pred[key]}
            if m is None:
                row["note"] = _missing(link)
            rows.append(row)
    return {"rows": rows, "results": results}


def compression_configs(link: str = "ethernet_25g", *,
                        methods: Sequence[str] = ("none", "fp16", "powersgd", "topk"),
                        steps: int = 6, model: ModelConfig = DDP_MODEL,
                        batch_size: int = 64) -> list[dict[str, Any]]:
    """The runs of ``compression_on_link`` across ``link``, one per method, as configs."""
    return [dict(strategy="compress", world_size=2, steps=steps, model=model,
                 batch_size=batch_size, threads_per_rank=1, nodes=2, link=link,
                 options={"method": m}) for m in methods]


def compression_on_link(link: str = "ethernet_25g", *,
                        methods: Sequence[str] = ("none", "fp16", "powersgd", "topk"),
                        **sizes: Any) -> dict[str, Any]:
    """DDP with each compression hook on loopback and across ``link``: step time, speedup
    over no compression, and the wire time the link should take for the bytes sent."""
    across = compression_configs(link, methods=methods, **sizes)
    loop = {m: _run(**{k: v for k, v in c.items() if k not in ("nodes", "link")})
            for m, c in zip(methods, across)}
    slow: dict[str, Any] = {}
    if support().available:
        runs = _run_many(across)
        slow = dict(zip(methods, runs))
        model_link = predict.link_model(runs[0].metrics["link"])
    else:
        model_link = predict.link_model(parse_link(link))
    rows = []
    for m in methods:
        wire = float(loop[m].metrics["wire_bytes_per_step"][-1])
        row = {"method": m, "wire_bytes": wire, "loopback_step_s": loop[m].step_time_s,
               "link_step_s": slow[m].step_time_s if m in slow else None,
               "predicted_link_comm_s": alpha_beta_time(2, wire, model_link.alpha_s,
                                                        model_link.bandwidth_Bps)}
        if m not in slow:
            row["note"] = _missing(link)
        rows.append(row)
    none = rows[0]
    for row in rows:
        row["speedup_loopback"] = none["loopback_step_s"] / row["loopback_step_s"]
        row["speedup_link"] = (none["link_step_s"] / row["link_step_s"]
                               if row["link_step_s"] else None)
    return {"rows": rows, "loopback": loop, "link": slow}
