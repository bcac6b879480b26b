"""Rank functions defined from source, as a student's notebook cell defines them.

Code-exercise tests build honest and broken answers from a shared body with a slip swapped
in; ``rank_function`` compiles one with ``torch`` (and any other names) in scope, so the
grader receives a plain function just as it would from an answer cell.
"""

from __future__ import annotations

from typing import Any


def rank_function(name: str, params: str, body: str, **names: Any) -> Any:
    """``def name(params):`` followed by ``body`` (indented lines), with ``torch`` and
    ``names`` as its globals; e.g. ``rank_function("f", "ctx, tensor", "    tensor += 1\\n")``."""
    import torch

    namespace: dict[str, Any] = {"torch": torch, **names}
    exec(f"def {name}({params}):\n{body}", namespace)  # our own test sources
    return namespace[name]
