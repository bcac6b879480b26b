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
from typing import TYPE_CHECKING, Any

from labkit.grading.sandbox.wire import decode, encode

if TYPE_CHECKING:
    from labkit.grading.parts import Question

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


def answer(q: Question, label: str, fn: Callable[..., Any], args: Sequence[Any] = (),
           kwargs: Mapping[str, Any] | None = None, *, forbid: Sequence[str] = (),
           reader: Callable[[Any], Any] = lambda v: v, where: str = "", hint: str = "",
           gate: bool = False) -> Any | None:
    """Call the student's function and read its answer, or record why not on part ``label``.

    Records the failure (not implemented, raised, called a forbidden labkit function, an
    answer of the wrong shape: ``reader`` returns a message string) and returns None;
    otherwise returns what ``reader`` made of the value, and records nothing.
    """
    where = where or getattr(fn, "__name__", "your function")
    try_ = f" Try: {hint}" if hint else ""
    try:
        out = call(fn, args, kwargs, forbid)
    except NotImplementedError:
        q.record(label, False, f"{where}: not implemented yet: replace `raise "
                 "NotImplementedError` with your code.", gate=gate)
        return None
    except Exception as exc:  # noqa: BLE001 (the student's code raised: that is feedback)
        q.record(label, False, f"{where} raised {exc}.{try_}", gate=gate)
        return None
    if out.used or out.tampered:
        q.forbidden(label, out.used, out.tampered, gate=gate)
        return None
    got = reader(out.value)
    if isinstance(got, str):
        q.record(label, False, f"{where}: {got}{try_}", gate=gate)
        return None
    return got


def launch(fn: Callable[..., Any], check: str, world_size: int, rank_args: Sequence[Any],
           forbid: Sequence[str] = (), timeout_s: float = LAUNCH_TIMEOUT_S) -> dict[str, Any]:
    """Run the harness ``rank_side.<check>_rank`` with ``fn`` on ``world_size`` relayed ranks.

    Rank ``r`` gets ``rank_args[r]`` only. Each rank is a process of its own whose messages
    the grader relays and records (:mod:`labkit.grading.sandbox.relay`); in autograding
    each is a box of its own, with the ``forbid`` modules absent. Returns ``results``
    (plain, per rank), ``timeline`` (the relay's record on its clock) and ``record``
    (bytes, messages, peers and collectives per rank and case, counted by the relay).
    """
    if is_remote(fn):
        return fn.launch(check, world_size, rank_args, forbid)  # type: ignore[attr-defined, no-any-return]
    from labkit.grading.sandbox.rank_boxes import run_local

    return run_local(fn, check, world_size, rank_args, forbid, timeout_s)
