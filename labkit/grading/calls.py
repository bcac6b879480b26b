"""One way to call a student's function, whether it lives here or in the grading box.

In the student's own kernel a check gets the real function and calls it here (that is
feedback, not grading). During autograding it gets a
:class:`~labkit.grading.sandbox.remote.RemoteFunction`: the call runs in the box and only
plain data comes back. Both paths go through :mod:`labkit.grading.sandbox.wire`, so a
student sees locally exactly what the grader will see (a custom object is "not plain
data" here too), and both watch for calls into forbidden labkit modules (``forbid``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.grading.sandbox.wire import decode, encode

LAUNCH_TIMEOUT_S = 45.0


@dataclass
class Outcome:
    """What one call did: the plain value, and the forbidden calls it made."""

    value: Any
    used: list[str] = field(default_factory=list)
    tampered: bool = False


def is_remote(fn: object) -> bool:
    from labkit.grading.sandbox.remote import RemoteFunction

    return isinstance(fn, RemoteFunction)


def call(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
         forbid: Sequence[str] = ()) -> Outcome:
    """Call ``fn(*args, **kwargs)``; exceptions from the student's code propagate."""
    kwargs = dict(kwargs or {})
    if is_remote(fn):
        value, report = fn.call_watched(args, kwargs, forbid)  # type: ignore[attr-defined]
        return Outcome(value, report["used"], report["tampered"])
    from labkit.grading.sandbox.watch import CallWatch

    with CallWatch(tuple(forbid)) as watch:
        value = fn(*args, **kwargs)
    return Outcome(decode(encode(value)), watch.used, watch.tampered)


def launch(fn: Callable[..., Any], check: str, world_size: int, args: Sequence[Any],
           forbid: Sequence[str] = (), timeout_s: float = LAUNCH_TIMEOUT_S) -> dict[str, Any]:
    """Run the grader harness ``rank_side.<check>_rank`` with ``fn`` on real ranks.

    Returns ``results`` (plain, per rank), ``timeline`` and ``wire_bytes`` (bytes the
    box's loopback carried, measured outside the box; None when run locally).
    """
    if is_remote(fn):
        return fn.launch(check, world_size, args, forbid)  # type: ignore[attr-defined, no-any-return]
    import cloudpickle

    from labkit.grading import rank_side
    from labkit.runner import launch as run_ranks

    harness = getattr(rank_side, f"{check}_rank")
    result = run_ranks(harness, world_size, cloudpickle.dumps(fn), *args, list(forbid),
                       timeout_s=timeout_s, threads_per_rank=1)
    return {"results": decode(encode(result.results)), "timeline": result.timeline,
            "wire_bytes": None}
