"""The JSON-lines pipe between the grader and a box, with deadlines and a watchdog.

Replies are matched by request id and a random token (a student's own writes to the pipe,
or a forked copy of the server, cannot answer in its place); lines that are not JSON are
skipped (a line that does not start with ``{`` without parsing it, and each chunk is cut
into lines once: a flood of a million newlines costs the grader milliseconds, not the
quadratic re-copying of one buffer per line); a message over ``MAX_REPLY`` bytes, a box
that closes the pipe or one that is too slow to answer stops the box. While the grader
waits, ``watch`` runs every ``POLL_S`` seconds and may stop the box (a limit it went over).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from labkit.base.errors import LabError

MAX_REPLY = 64 * 2**20
POLL_S = 0.25  # how often a waiting grader looks at what the box uses


class BoxError(LabError):
    """The box died, broke the protocol, or could not start."""


class BoxTimeout(BoxError):
    """The box did not answer within the time limit (it has been killed)."""


class BoxLimit(BoxError):
    """The box went over one of its limits (it has been killed); ``what`` names it."""

    def __init__(self, what: str, message: str):
        self.what = what
        super().__init__(message)


class Pipe:
    """Messages to and from one box; the box supplies ``stop``, ``alive`` and ``stderr_tail``."""

    def __init__(self) -> None:
        self._to = self._from = -1
        self._partial = b""  # the start of a line whose newline has not come yet
        self._lines: deque[bytes] = deque()  # whole lines that may be messages
        self._counter = 0

    def stop(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def stderr_tail(self) -> str:
        raise NotImplementedError

    def fileno(self) -> int:
        return self._from

    def send(self, message: Mapping[str, Any]) -> None:
        """Write one JSON line to the box (raises BoxError when it is gone)."""
        data = (json.dumps(message) + "\n").encode()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._to, view):]
        except OSError as exc:
            raise BoxError(f"could not reach the box: {exc}") from None

    def pending(self) -> bool:
        """A whole line is already buffered (``select`` on the fd would not say so)."""
        return bool(self._lines)

    def feed(self) -> None:
        """Read what the box has written (call when ``select`` says it is readable)."""
        chunk = os.read(self._from, 1 << 20)
        if not chunk:
            tail = self.stderr_tail()
            self.stop()
            raise BoxError(f"the box exited{': ' + tail if tail else ''}")
        *lines, rest = (self._partial + chunk).split(b"\n")
        self._partial = rest
        self._lines.extend(line for line in lines if line.lstrip()[:1] == b"{")
        if len(self._partial) > MAX_REPLY:
            self.stop()
            raise BoxError(f"the box sent more than {MAX_REPLY} bytes in one message")

    def next_message(self) -> Any:
        """The next whole JSON message already read, or None (non-JSON lines are skipped)."""
        while self._lines:
            line = self._lines.popleft()
            try:
                return json.loads(line)
            except ValueError:
                continue
        return None

    def receive(self, deadline: float, watch: Callable[[], None] | None = None) -> Any:
        """The next JSON message from the box (lines that are not JSON are skipped)."""
        while True:
            line = self._read_line(deadline, watch)
            try:
                return json.loads(line)
            except ValueError:
                continue  # not a message (student output written to the pipe)

    def request(self, op: str, timeout: float, watch: Callable[[], None] | None = None,
                **payload: Any) -> dict[str, Any]:
        """Send one request; the reply, or BoxTimeout (box killed) / BoxError / BoxLimit.

        ``watch`` is called every ``POLL_S`` while waiting; it raises to stop the wait
        (e.g. BoxLimit when the box used more CPU than allowed)."""
        if not self.alive():
            raise BoxError(f"the box is not running; its last words: {self.stderr_tail()}")
        self._counter += 1
        rid, token = self._counter, secrets.token_hex(8)
        soft = payload.pop("limit", None)
        message = {"op": op, "id": rid, "token": token, **payload}
        if soft is not None:
            message["timeout"] = soft
        self.send(message)
        deadline = time.monotonic() + timeout
        while True:
            reply = self.receive(deadline, watch)
            if isinstance(reply, dict) and reply.get("id") == rid and reply.get("token") == token:
                return reply

    def _read_line(self, deadline: float, watch: Callable[[], None] | None) -> bytes:
        checked = time.monotonic()
        while not self._lines:
            now = time.monotonic()
            if watch is not None and now - checked >= POLL_S:
                checked = now
                try:
                    watch()
                except BoxError:
                    self.stop()
                    raise
            remaining = deadline - now
            if remaining <= 0:
                self.stop()
                raise BoxTimeout("no answer before the time limit")
            if not select.select([self._from], [], [], min(remaining, POLL_S))[0]:
                continue
            self.feed()
        return self._lines.popleft()
