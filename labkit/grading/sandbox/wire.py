"""What may cross between the student's box and the grader: plain values, as JSON.

The grader never unpickles anything the student's process made (unpickling runs code). A
value crosses as JSON built from a closed set of shapes: ``None``, ``bool``, ``int``,
``float`` (``NaN`` and infinities included), ``str``, lists, and three tagged objects:

* ``{"__tuple__": [...]}`` and ``{"__dict__": [[key, value], ...]}`` (so tuples and
  dicts with int keys, such as a pipeline plan ``{0: ["0F0", ...]}``, survive the trip);
* ``{"__tensor__": {"dtype", "shape", "data"}}``: a torch or numpy array as a flat list of
  numbers ("tensors converted to lists"); the grader rebuilds a plain ``torch.Tensor``;
* ``{"__timeline__": {...}}``: a ``labkit.Timeline`` (the grader sends recorded runs to a
  student's function this way; ``decode`` rebuilds the Timeline in the box).

Anything else (a student's own class, a function, a generator) crosses as
``{"__opaque__": "TypeName"}`` and decodes to :class:`Opaque`, which no check accepts as
an answer. ``decode`` only ever builds the types above, so whatever the student's side
sends, the grader holds inert data: no ``__eq__`` that says yes to everything, no code.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
MAX_ITEMS = 2_000_000  # numbers in all tensors of one message (about 16 MB of float64)


class WireError(ValueError):
    """A message broke the wire format (too deep, too big, or an unknown tag)."""


@dataclass(frozen=True)
class Opaque:
    """Stands for a value that could not cross as plain data (its type name only)."""

    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name} object (not plain data)>"


def _number(x: float) -> Any:
    """JSON cannot carry NaN/inf portably: tag them."""
    if math.isfinite(x):
        return x
    return {"__float__": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}


def encode(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON-ready plain data (see the module docstring for the shapes)."""
    if _depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _number(float(value))
    tensor = _tensor_parts(value)
    if tensor is not None:
        return {"__tensor__": tensor}
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _number(float(value))
    if isinstance(value, list):
        return [encode(v, _depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, _depth + 1) for v in value]}
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {str(k): encode(v, _depth + 1) for k, v in value.items()}
        return {"__dict__": [[encode(k, _depth + 1), encode(v, _depth + 1)]
                             for k, v in value.items()]}
    if type(value).__name__ == "Timeline" and hasattr(value, "to_json"):
        return {"__timeline__": value.to_json()}
    return {"__opaque__": type(value).__name__}


def _tensor_parts(value: Any) -> dict[str, Any] | None:
    """dtype / shape / flat data of a torch tensor or numpy array, else None."""
    module = type(value).__module__ or ""
    if module.startswith("torch") and hasattr(value, "detach"):
        t = value.detach().cpu()
        return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                "data": [_number(float(x)) if not isinstance(x, bool) else x
                         for x in t.reshape(-1).tolist()]}
    if module == "numpy" and hasattr(value, "shape") and hasattr(value, "dtype"):
        return {"dtype": str(value.dtype), "shape": list(value.shape),
                "data": [_number(float(x)) for x in value.reshape(-1).tolist()]}
    return None


def decode(data: Any, *, budget: list[int] | None = None, _depth: int = 0) -> Any:
    """Rebuild plain values from ``encode``'s output; never builds any other type."""
    budget = budget if budget is not None else [MAX_ITEMS]
    if _depth > MAX_DEPTH:
        raise WireError(f"message nested deeper than {MAX_DEPTH} levels")
    if data is None or isinstance(data, (bool, str)):
        return data
    if type(data) in (int, float):
        return data
    if isinstance(data, list):
        return [decode(v, budget=budget, _depth=_depth + 1) for v in data]
    if not isinstance(data, dict):
        raise WireError(f"unexpected {type(data).__name__} in a message")
    if len(data) == 1:
        (tag, body), = data.items()
        if tag == "__float__":
            return float(body)
        if tag == "__tuple__":
            return tuple(decode(v, budget=budget, _depth=_depth + 1) for v in body)
        if tag == "__dict__":
            return {_key(decode(k, budget=budget, _depth=_depth + 1)):
                    decode(v, budget=budget, _depth=_depth + 1) for k, v in body}
        if tag == "__tensor__":
            return _tensor(body, budget)
        if tag == "__timeline__":
            from labkit.analysis.timeline import Timeline

            return Timeline.from_json(body)
        if tag == "__opaque__":
            return Opaque(str(body))
    return {str(k): decode(v, budget=budget, _depth=_depth + 1) for k, v in data.items()}


def _key(k: Any) -> Any:
    if isinstance(k, (list, dict)):
        raise WireError("a dict key must be a number, a string or a tuple")
    return k


def _tensor(body: Any, budget: list[int]) -> Any:
    import torch

    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise WireError("malformed tensor")
    values = [float(v["__float__"]) if isinstance(v, dict) else v for v in body["data"]]
    budget[0] -= len(values)
    if budget[0] < 0:
        raise WireError(f"more than {MAX_ITEMS} numbers in one message")
    if not all(type(v) in (int, float, bool) for v in values):
        raise WireError("tensor data must be numbers")
    shape = [int(s) for s in body.get("shape", [len(values)])]
    dtype = getattr(torch, str(body.get("dtype", "float64")), None)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float64
    return torch.tensor(values, dtype=dtype).reshape(shape)
