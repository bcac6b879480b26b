"""Inside the box: what a student's function called while the grader watched it.

Two watchers, both started by grader code in the box right before the student's function
runs and read right after it returns:

* :class:`CallWatch` records every call into a forbidden labkit module (for problem set 1
  ``labkit.theory``, the same calculators the answer key uses; for the 1F1B exercise
  ``labkit.schedules``, which already builds that plan). It hooks ``sys.setprofile`` (and
  ``threading.setprofile``) so an indirect call (``getattr(__import__("labkit"), ...)``)
  is seen too. If the student's code removes the hook, ``tampered`` says so and the grader
  treats the part as failed.
* :class:`DispatchCounter` counts every ``c10d`` operator that reaches the torch dispatcher
  (a ``TorchDispatchMode``). ``dist.all_reduce``, ``ctx.comm.all_reduce`` and a direct
  ``_get_default_group().allreduce(...)`` all become ``c10d.allreduce_`` there, so a ring
  check counts collectives at the process-group level, not only through labkit's wrappers,
  and it also totals the bytes of every point-to-point send.

Both live in the student's process, so a determined student can still fool them; what no
student can fool is the grader outside the box, which compares the values that come back
and (for the ring) the bytes the box's own loopback interface carried.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

# c10d operators that move data between ranks (names as the dispatcher prints them,
# without the ".default" overload suffix). Sends and receives are point to point.
P2P_OPS = ("c10d.send", "c10d.recv_", "c10d.recv_any_source_")
HARMLESS_OPS = ("c10d.barrier", "c10d.monitored_barrier_")


class CallWatch:
    """Records calls into modules whose names start with one of ``forbidden``."""

    def __init__(self, forbidden: tuple[str, ...] | list[str]):
        self.forbidden = tuple(forbidden)
        self.used: list[str] = []
        self.tampered = False
        self._previous: Any = None
        self._hook = self._profile  # one bound method, so the check below can use `is`

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if isinstance(module, str) and module.startswith(self.forbidden) \
                and module != __name__:  # the watch's own __exit__ is not the student's call
            name = f"{module}.{frame.f_code.co_name}"
            if name not in self.used:
                self.used.append(name)

    def __enter__(self) -> CallWatch:
        if self.forbidden:
            self._previous = sys.getprofile()
            sys.setprofile(self._hook)
            threading.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.forbidden:
            return
        if sys.getprofile() is not self._hook:
            self.tampered = True
        sys.setprofile(self._previous)
        threading.setprofile(None)  # type: ignore[arg-type]

    def report(self) -> dict[str, Any]:
        return {"used": list(self.used), "tampered": self.tampered}


def make_dispatch_counter() -> Any:
    """A ``TorchDispatchMode`` that counts c10d operators and sent bytes (imports torch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class DispatchCounter(TorchDispatchMode):  # type: ignore[misc]
        """Counts every c10d operator that reaches the dispatcher while it is active."""

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # True would import torch._dynamo (seconds per rank) for nothing

        def __init__(self) -> None:
            super().__init__()
            self.ops: dict[str, int] = {}
            self.sent_bytes = 0
            self.active = True

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            name = str(func).removesuffix(".default")
            if name.startswith("c10d.") and self.active:
                self.ops[name] = self.ops.get(name, 0) + 1
                if name == "c10d.send":
                    self.sent_bytes += sum(int(t.numel()) * int(t.element_size())
                                           for t in args[0])
            return func(*args, **(kwargs or {}))

        def collectives(self) -> list[str]:
            """Data collectives used (anything but point-to-point and barriers)."""
            return sorted(op for op in self.ops if op not in P2P_OPS + HARMLESS_OPS)

    return DispatchCounter()
