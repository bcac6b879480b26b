"""Counting bytes the way the ZeRO formulas do, from the tensors a rank really holds.

* ``storage_bytes``: model-state bytes per term (params / grads / optimizer), summed over
  the distinct *storages* of the tensors a rank keeps between steps. A view shares its
  base's storage and is counted once, in the first term that holds it (a fp32 optimizer
  that updates the parameters in place adds no master copy).
* ``SavedActivations``: bytes autograd saves for backward, seen through
  ``torch.autograd.graph.saved_tensors_hooks``; storages are deduplicated and parameters
  skipped, matching ``labkit.theory.mlp_activation_bytes``.
* ``comm_per_step``: bytes from the trace. Payload is what the caller handed in (see
  ``labkit.trace.comm``); wire bytes apply the ring factor (all-reduce 2(n-1)/n, reduce-scatter
  and all-gather (n-1)/n), the convention of the ZeRO paper's communication analysis.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from labkit.base.events import Event, Lane
from labkit.trace.comm import wire_bytes

TERMS = ("params", "grads", "optimizer")


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes())


def storage_bytes(kept: Mapping[str, Iterable[torch.Tensor]]) -> dict[str, int]:
    """Bytes per term over distinct storages (a storage counts once, in its first term)."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, int] = {}
    for term in TERMS:
        total = 0
        for t in kept.get(term, ()):
            key = _storage_key(t)
            if key not in seen:
                seen.add(key)
                total += key[1]
        out[term] = total
    return out


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's state (moments, momentum buffers, step counters)."""
    return [v for state in opt.state.values() for v in state.values()
            if isinstance(v, torch.Tensor)]


class SavedActivations:
    """``with SavedActivations(params) as s: loss = model(x)``; then ``s.bytes``."""

    def __init__(self, params: Iterable[torch.Tensor] = ()):
        self._skip = {_storage_key(p) for p in params if p.numel() > 0}
        self._seen: set[tuple[int, int]] = set()
        self.bytes = 0
        self.tensors = 0
        self._ctx: Any = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self._skip and key not in self._seen and key[1] > 0:
            self._seen.add(key)
            self.bytes += key[1]
            self.tensors += 1
        return t

    def __enter__(self) -> SavedActivations:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)


def comm_per_step(events: list[Event], world_size: int) -> dict[str, float]:
    """Median over steps (first skipped when there are more) of this rank's comm bytes."""
    by_step: dict[int, list[Event]] = {}
    for e in events:
        if e.lane == Lane.COMM and e.step is not None and e.bytes:
            by_step.setdefault(e.step, []).append(e)
    if not by_step:
        return {"payload": 0.0, "wire": 0.0}
    steps = sorted(by_step)
    if len(steps) > 1:
        steps = steps[1:]
    payload = [float(sum(e.bytes or 0 for e in by_step[s])) for s in steps]
    wire = [sum(wire_bytes(e.op, e.bytes or 0, world_size) for e in by_step[s]) for s in steps]
    return {"payload": statistics.median(payload), "wire": statistics.median(wire)}


def predicted(num_params: int, world_size: int, stage: int, precision: str,
              optimizer: str) -> dict[str, Any]:
    """The calculator's numbers for this run (fp32 -> "fp32", bf16 -> "mixed")."""
    from labkit.theory import bytes_per_param, zero_comm_volume, zero_memory

    theory_precision = "mixed" if precision == "bf16" else "fp32"
    mem = zero_memory(num_params, world_size, stage, theory_precision, optimizer)
    comm = zero_comm_volume(num_params, stage, theory_precision, dp=world_size)
    ddp = zero_comm_volume(num_params, 0, theory_precision, dp=world_size)
    return {"bytes": {k: mem[k] for k in TERMS},
            "bytes_per_param": bytes_per_param(theory_precision, optimizer),
            "theory_precision": theory_precision,
            "comm_wire": comm["total"], "ddp_comm_wire": ddp["total"]}


def fill_prediction(rec: Any, pred: dict[str, Any], comm: dict[str, float],
                    n: int) -> None:
    """The calculator's numbers and this rank's traced bytes, in the record."""
    rec.predicted_bytes, rec.bytes_per_param = pred["bytes"], pred["bytes_per_param"]
    rec.theory_precision = pred["theory_precision"]
    rec.comm_bytes_per_step, rec.comm_payload_bytes_per_step = comm["wire"], comm["payload"]
    rec.predicted_comm_bytes_per_step = pred["comm_wire"]
    rec.ddp_comm_bytes_per_step = pred["ddp_comm_wire"]
    rec.comm_ratio_vs_ddp = comm["wire"] / pred["ddp_comm_wire"] if n > 1 else 0.0
