"""The mechanism on the page, checked: a lesson's editable cell implements what it teaches (a
ring from send/recv, Megatron's f/g, a ZeRO-1 step...), runs it on real ranks, and sets its
result beside labkit's own implementation with ``compare``.

``compare(mine, labkits, what=...)`` walks both results together (per-rank lists, dicts,
tensors, arrays, numbers, strings such as ``params_sha256``) and says, in words, whether they
agree: everywhere to the tolerance, or where they first part (the rank, the key, the element,
both values). A student who edits the cell and breaks it reads which value went wrong, not a
traceback. The result prints as that sentence and is truthy only when the two agree; the
notebook tests break every mechanism cell on purpose and check that its comparison says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MATCH = "matches labkit's"
MISMATCH = "does not match labkit's"
"""The words a comparison prints; the notebook tests look for them."""


@dataclass(frozen=True)
class Comparison:
    """Whether the cell's result agrees with labkit's, and the sentence that says so."""

    ok: bool
    text: str
    max_abs_diff: float
    values: int

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.text

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the sentence
        p.text(self.text)


@dataclass
class _Walk:
    atol: float
    rtol: float
    first: str | None = None
    worst: float = 0.0
    values: int = 0

    def miss(self, where: str, why: str) -> None:
        if self.first is None:
            self.first = f"{where or 'the result'}: {why}"


def _as_array(x: Any) -> np.ndarray | None:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch
        return np.asarray(x.detach().cpu().double().numpy())
    if isinstance(x, np.ndarray):
        return x.astype(np.float64) if x.dtype.kind in "biuf" else x
    return None


def _short(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _walk(mine: Any, ref: Any, where: str, w: _Walk) -> None:
    a, b = _as_array(mine), _as_array(ref)
    if a is not None or b is not None:
        a = a if a is not None else np.asarray(mine, dtype=np.float64)
        b = b if b is not None else np.asarray(ref, dtype=np.float64)
        if a.shape != b.shape:
            w.miss(where, f"yours has shape {tuple(a.shape)}, labkit's {tuple(b.shape)}")
            return
        w.values += a.size
        if a.size == 0:
            return
        diff = np.abs(a - b)
        w.worst = max(w.worst, float(np.nanmax(diff)) if np.isfinite(diff).any() else math.inf)
        bad = ~(diff <= w.atol + w.rtol * np.abs(b))
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            spot = f"{where}[{', '.join(map(str, idx))}]" if a.ndim else where
            w.miss(spot, f"yours {float(a[idx]):.6g}, labkit's {float(b[idx]):.6g}")
        return
    if isinstance(ref, Mapping):
        if not isinstance(mine, Mapping) or set(mine) != set(ref):
            keys = sorted(map(str, mine)) if isinstance(mine, Mapping) else type(mine).__name__
            w.miss(where, f"yours has {keys}, labkit's has {sorted(map(str, ref))}")
            return
        for k in ref:
            _walk(mine[k], ref[k], f"{where}[{k!r}]", w)
        return
    if isinstance(ref, Sequence) and not isinstance(ref, str | bytes):
        if not isinstance(mine, Sequence) or isinstance(mine, str | bytes) or len(mine) != len(ref):
            size = len(mine) if isinstance(mine, Sequence) else type(mine).__name__
            w.miss(where, f"yours has {size} items, labkit's {len(ref)}")
            return
        for i, (x, y) in enumerate(zip(mine, ref, strict=True)):
            _walk(x, y, f"{where}[{i}]", w)
        return
    if isinstance(ref, bool | str | bytes) or ref is None:
        w.values += 1
        if mine != ref:
            w.miss(where, f"yours {_short(mine)}, labkit's {_short(ref)}")
        return
    try:
        x, y = float(mine), float(ref)
    except (TypeError, ValueError):
        w.values += 1
        if mine != ref:
            w.miss(where, f"yours {_short(mine)}, labkit's {_short(ref)}")
        return
    w.values += 1
    diff = abs(x - y)
    w.worst = max(w.worst, diff if math.isfinite(diff) else math.inf)
    if not diff <= w.atol + w.rtol * abs(y):
        w.miss(where, f"yours {x:.6g}, labkit's {y:.6g}")


def compare(mine: Any, labkits: Any, *, what: str, atol: float = 0.0, rtol: float = 0.0,
            per_rank: bool = False) -> Comparison:
    """Set the cell's result beside labkit's: equal everywhere (numbers within ``atol`` +
    ``rtol`` x |labkit's|, everything else exactly), or the first place they part.

    ``per_rank=True`` names the top-level items ranks ("rank 1[3]") instead of indices.
    """
    if atol < 0 or rtol < 0:
        raise ValueError(f"compare: atol={atol:g} and rtol={rtol:g} must be >= 0 (e.g. atol=1e-6)")
    w = _Walk(atol=atol, rtol=rtol)
    if per_rank and isinstance(mine, Sequence) and isinstance(labkits, Sequence) \
            and len(mine) == len(labkits):
        for r, (x, y) in enumerate(zip(mine, labkits, strict=True)):
            _walk(x, y, f"rank {r}", w)
    else:
        _walk(mine, labkits, "", w)
    tol = f" (tolerance {atol:g})" if atol or rtol else ""
    spread = f"max |difference| {w.worst:.3g} over {w.values} values"
    if w.first is None:
        return Comparison(True, f"✓ {what}: yours {MATCH}{tol}; {spread}.", w.worst, w.values)
    return Comparison(False, f"✗ {what}: yours {MISMATCH}{tol}. First difference at {w.first}; "
                             f"{spread}. Look again at the lines you changed in the cell above.",
                      w.worst, w.values)


def one_process_text(run: Any, label: str) -> str:
    """How far ``run``'s weights ended from one process's on the global batch, beside what
    float rounding reaches for its optimizer, lr and steps (``labkit.theory.rounding``):
    within it, or more -- a bug to report, not rounding."""
    from labkit.theory.rounding import run_tolerance

    c, diff = run.config, float(run.metrics["max_abs_diff_vs_reference"])
    tol = run_tolerance(c)
    if diff <= tol:
        return (f"{label}: |w - one process| = {diff:.1g}, within what float rounding reaches "
                f"({tol:.0e} after {c.steps} steps of {c.optimizer} at lr {c.lr:g}; "
                f"labkit.theory.rounding)")
    return (f"{label}: |w - one process| = {diff:.1g}, more than float rounding's {tol:.0e}: "
            f"report this run")
