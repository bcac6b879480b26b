"""Read the attribute docstrings of a dataclass (the string under each field).

Configs document each field with a docstring line under it (torchtitan's habit). This
module reads them back, so the CLI help and the error messages use the same words.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache


@cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field name: docstring}`` for the fields of ``cls`` (and its bases) that have one."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):  # bases first, so a subclass can override
        docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    docs: dict[str, str] = {}
    if not isinstance(body, ast.ClassDef):
        return docs
    items = body.body
    for node, nxt in zip(items, items[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
