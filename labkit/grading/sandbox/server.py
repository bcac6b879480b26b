"""Runs INSIDE the box: executes the student's cells and answers the grader's requests.

Started by :mod:`labkit.grading.sandbox.box` as ``python -m labkit.grading.sandbox.server
RFD WFD``: requests arrive as JSON lines on file descriptor RFD, replies leave on WFD
(the student's ``print`` goes to a captured buffer, never to the protocol). Requests:

* ``init``: the submission's data files (e.g. the recorded traces of problem set 4) are
  written into a fresh working folder; the notebook's relative paths work from there;
* ``run``: one cell of the student's notebook, in an IPython shell (magics work), with
  its printed output, its last value and its error, if any, sent back;
* ``describe``: a global the grader's test needs: "callable", or its value as plain data;
* ``call``: call a student's function with plain arguments, watched by ``CallWatch``;
* ``export``: a student's function as cloudpickle bytes, for the grader to hand, unopened,
  to the rank boxes of a relayed exercise (:mod:`relay`): the grader never unpickles it.

Every request has a time limit: a timer sends this process SIGINT (a ``KeyboardInterrupt``
in the cell, as Jupyter's stop button does). A student who blocks that is stopped from
outside: the grader kills the whole box and starts a fresh one.

A forked copy of this process (a cell that calls ``os.fork()``) returns from the
student's code into the request loop too; it exits there instead of answering, so only
the server the grader started ever speaks on the pipe.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from labkit.grading.sandbox.watch import CallWatch
from labkit.grading.sandbox.wire import decode, encode

OUTPUT_LIMIT = 20_000  # characters of printed output kept per request
WORKDIR = "submission"


class _Capped(io.StringIO):
    """A stdout/stderr that keeps at most OUTPUT_LIMIT characters (a print loop stays cheap)."""

    def write(self, s: str) -> int:
        room = OUTPUT_LIMIT - self.tell()
        if room > 0:
            super().write(s[:room])
        return len(s)


_armed = threading.Event()


def _on_sigint(signum: int, frame: Any) -> None:
    """Interrupt only while a request is running (a late timer never kills the server)."""
    if _armed.is_set():
        raise KeyboardInterrupt("stopped: the cell ran past its time limit")


@contextlib.contextmanager
def _limit(seconds: float | None) -> Any:
    """SIGINT this process after ``seconds`` (the soft per-cell limit)."""
    timer = None
    if seconds:
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
        timer.daemon = True
        timer.start()
    _armed.set()
    try:
        yield
    finally:
        _armed.clear()
        if timer is not None:
            timer.cancel()


def _error(exc: BaseException) -> dict[str, Any]:
    """ename / evalue / a traceback without this module's or IPython's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "IPython" not in f.filename and "labkit/grading/sandbox" not in f.filename]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return {"ename": type(exc).__name__, "evalue": str(exc)[:2000],
            "traceback": "".join(lines)[-OUTPUT_LIMIT:]}


class Server:
    """The student's namespace and the request handlers."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config

        cfg = Config()
        cfg.HistoryManager.enabled = False
        self.shell = InteractiveShell.instance(config=cfg)
        self.shell._showtraceback = lambda *a, **k: None  # type: ignore[method-assign]
        hook = self.shell.displayhook  # the last value goes back as data, not as "Out[n]:"
        hook.write_output_prompt = lambda: None  # type: ignore[method-assign]
        hook.write_format_data = lambda *a, **k: None  # type: ignore[method-assign]
        self.ns: dict[str, Any] = self.shell.user_ns

    # ---- requests -----------------------------------------------------------------------
    def init(self, files: dict[str, str]) -> dict[str, Any]:
        work = Path(os.environ.get("TMPDIR", "/tmp")) / WORKDIR
        work.mkdir(parents=True, exist_ok=True)
        for rel, data in files.items():
            target = (work / rel).resolve()
            if work.resolve() not in target.parents:
                continue  # no path escapes the working folder
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(data))
        os.chdir(work)
        return {"cwd": str(work)}

    def run(self, source: str, timeout: float | None = None) -> dict[str, Any]:
        out, err = _Capped(), _Capped()
        reply: dict[str, Any] = {}
        try:
            with _limit(timeout), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                result = self.shell.run_cell(source, store_history=False, silent=False)
        except KeyboardInterrupt as exc:  # the timer fired between IPython's own handlers
            reply["error"] = _error(exc)
        else:
            failure = result.error_before_exec or result.error_in_exec
            if failure is not None:
                reply["error"] = _error(failure)
            elif result.result is not None:
                reply["result"] = repr(result.result)[:OUTPUT_LIMIT]
        reply.update(stdout=out.getvalue(), stderr=err.getvalue())
        return reply

    def describe(self, name: str, timeout: float | None = None) -> dict[str, Any]:
        if name not in self.ns:
            return {"kind": "missing"}
        value = self.ns[name]
        if callable(value) and not isinstance(value, type):
            return {"kind": "callable"}
        return {"kind": "value", "value": encode(value)}

    def call(self, name: str, args: Any, kwargs: Any, forbid: list[str],
             timeout: float | None = None) -> dict[str, Any]:
        fn = self.ns.get(name)
        if not callable(fn):
            return {"error": {"ename": "NameError", "evalue": f"{name} is not defined",
                              "traceback": ""}}
        out = _Capped()
        watch = CallWatch(forbid)
        reply: dict[str, Any] = {}
        try:
            plain_args, plain_kwargs = decode(args), decode(kwargs)
            with _limit(timeout), contextlib.redirect_stdout(out), \
                    contextlib.redirect_stderr(out), watch:
                value = fn(*plain_args, **plain_kwargs)
            reply["value"] = encode(value)
        except BaseException as exc:  # noqa: BLE001 (any failure of student code is data)
            reply["error"] = _error(exc)
        reply.update(watch.report(), stdout=out.getvalue())
        return reply

    def export(self, name: str, timeout: float | None = None) -> dict[str, Any]:
        import cloudpickle

        fn = self.ns.get(name)
        if not callable(fn):
            return {"error": {"ename": "NameError", "evalue": f"{name} is not defined",
                              "traceback": ""}}
        try:
            blob = cloudpickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 (an unpicklable closure is feedback)
            return {"error": _error(exc)}
        return {"blob": base64.b64encode(blob).decode()}


OPS = ("init", "run", "describe", "call", "export")


def serve(rfd: int, wfd: int) -> None:
    """Answer requests until the grader closes the pipe."""
    signal.signal(signal.SIGINT, _on_sigint)
    owner = os.getpid()
    server = Server()
    reader = os.fdopen(rfd, "r", encoding="utf-8")
    for line in reader:
        request = json.loads(line)
        op = request.pop("op")
        rid, token = request.pop("id"), request.pop("token")
        try:
            body = getattr(server, op)(**request) if op in OPS else {"pong": True}
            reply = {"id": rid, "token": token, "ok": True, **body}
        except BaseException as exc:  # noqa: BLE001 (report, keep serving)
            reply = {"id": rid, "token": token, "ok": False, "error": _error(exc)}
        if os.getpid() != owner:  # a fork of the student's came back here: not ours to answer
            os._exit(0)
        data = (json.dumps(reply) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(wfd, view):]


if __name__ == "__main__":
    sys.stdin = open(os.devnull)  # noqa: SIM115 (a cell that calls input() gets EOF, not a hang)
    serve(int(sys.argv[1]), int(sys.argv[2]))
