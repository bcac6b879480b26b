"""The two messages a rank sends up its result pipe, both sides of the wire in one place.

A rank ends its job with exactly one message: ``R`` + its ``RankReport`` pickled BY VALUE
(cloudpickle, so tensors of any size arrive as bytes, never as shared memory owned by a
rank about to exit, and classes defined in a notebook come along), or ``E`` + its error
as plain strings and ints (which always unpickle, whatever broke). The supervisor decodes
either into a report or a ``RankFailure``; a report it cannot rebuild is that rank's
failure, with the reason. Torch-free: the supervisor imports it.
"""

from __future__ import annotations

import io
import pickle
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from labkit.base.errors import RankFailure

RESULT, ERROR = b"R", b"E"


def send_report(conn: Connection, report: object, rank: int) -> None:
    """The result message, then everything printed so far."""
    import cloudpickle

    buf = io.BytesIO()
    buf.write(RESULT)
    try:
        cloudpickle.dump(report, buf, protocol=5)
    except Exception as exc:
        raise TypeError(f"rank {rank} returned a value that cannot be sent to the supervisor "
                        f"({type(exc).__name__}: {exc}); return plain values, numpy arrays or "
                        f"tensors") from exc
    conn.send_bytes(buf.getbuffer())
    sys.stdout.flush()
    sys.stderr.flush()


def send_error(conn: Connection, rank: int, exc: BaseException) -> None:
    """The error message (call it inside the ``except`` block: it sends the traceback)."""
    message = f"{type(exc).__name__}: {exc}"
    try:
        conn.send_bytes(ERROR + pickle.dumps((rank, time.monotonic_ns(), message,
                                              traceback.format_exc())))
    finally:
        sys.stderr.flush()


def decode(rank: int, data: bytes) -> tuple[Any, tuple[int, RankFailure] | None]:
    """One message -> (the report, None) or (None, (monotonic ns, the failure))."""
    kind, body = data[:1], memoryview(data)[1:]
    if kind == RESULT:
        try:
            return pickle.loads(body), None
        except Exception as exc:  # noqa: BLE001 - any decoding error is this rank's failure
            return None, (time.monotonic_ns(), RankFailure(
                rank, "result", f"rank {rank} finished, but the supervisor could not rebuild "
                f"the result it sent ({len(body)} bytes): {type(exc).__name__}: {exc}; "
                f"return plain values, numpy arrays or tensors", traceback.format_exc()))
    _, t_ns, message, tb = pickle.loads(body)  # plain strings and ints: always loads
    return None, (t_ns, RankFailure(rank, "exception", message, tb))
