"""Runs INSIDE one rank box of a relayed exercise: one rank of the student's function.

Problem set 3 asks for communication code (an all-reduce from send and recv, gradient
accumulation with a bucketed sync, a ZeRO-1 step). Graded that way on real gloo ranks inside one
box, a student who owns the interpreter can always find a second way between the ranks
(the process group itself, a file, a socket) and hide it from any counter that runs in
the same interpreter. So each rank runs in a box of its own (no network, its own /tmp,
pid and IPC namespaces: nothing to share), with **no process group**: ``ctx.comm`` here
is a :class:`RelayComm`, whose every message goes out on this box's pipe to the grader,
which relays it to the peer's box and records it (:mod:`relay`). What the grader did not
carry did not happen.

Started by :mod:`box` as ``python -m labkit.grading.sandbox.relay_rank RFD WFD``. After
the usual ``init`` request, each ``job`` message names a harness of
:mod:`labkit.grading.rank_side`, this rank's number and the world size, this rank's
inputs (plain data: a rank never learns another rank's inputs, or how they were drawn),
and the student's function as cloudpickle bytes (made in the student's own box). The
rank answers ``done`` with its result as plain data, or ``done`` with an ``error``.

Frames this rank sends while it works (one JSON line each):

* ``{"op": "send", "peer", "tag", "tensor"}``: a message (isend and send alike: the
  grader holds it until the peer asks);
* ``{"op": "recv", "rid", "peer", "tag", "nbytes"}``: a receive is posted (``irecv``;
  posted receives take the peer's messages in the order they were posted, as in gloo);
* ``{"op": "coll", "rid", "kind", "reduce", "tensor", "root", "out"}``: this rank's part of
  a collective (the k-th collective of every rank must be the same one);
* ``{"op": "wait", "rid"}``: the rank blocks until the receive or collective ``rid`` is
  done; the grader answers ``{"op": "data", "rid", "tensor"}`` (or an ``error``). A rank
  reads only after it said ``wait``, so answers never arrive out of turn;
* ``{"op": "step", "case", "edge"}``: the harness starts or ends case ``case``.

A tensor crosses as ``{"dtype", "b64"}``: its raw little-endian bytes, flat.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

TAGS = 256
"""Tags a message may carry: 0..255. A tag is not counted as bytes, so it must not be able
to carry a tensor's worth of information on its own."""
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
          "uint8", "bool")


def pack(tensor: Any) -> dict[str, str]:
    """A tensor as ``{"dtype", "b64"}`` (contiguous, flat, CPU)."""
    import torch

    t = tensor.detach().cpu().contiguous().reshape(-1)
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise TypeError(f"tensors of dtype {dtype} cannot be sent; use one of {DTYPES}")
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"dtype": dtype, "b64": base64.b64encode(raw).decode()}


def unpack(data: Any) -> Any:
    """``pack``'s output as a flat tensor (raises ValueError on anything malformed)."""
    import torch

    if not isinstance(data, dict) or data.get("dtype") not in DTYPES \
            or not isinstance(data.get("b64"), str):
        raise ValueError("a tensor must be {'dtype': one of DTYPES, 'b64': str}")
    raw = base64.b64decode(data["b64"], validate=True)
    dtype = getattr(torch, data["dtype"])
    size = torch.empty(0, dtype=dtype).element_size()
    if len(raw) % size:
        raise ValueError(f"{len(raw)} B is not a whole number of {data['dtype']} values")
    if not raw:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).clone()


class Link:
    """This rank's two pipes: frames out, answers in (read only while the rank waits)."""

    def __init__(self, rfd: int, wfd: int):
        self.reader = os.fdopen(rfd, "r", encoding="utf-8")
        self.wfd = wfd
        self.lock = threading.Lock()

    def post(self, frame: dict[str, Any]) -> None:
        data = memoryview((json.dumps(frame) + "\n").encode())
        with self.lock:
            while data:
                data = data[os.write(self.wfd, data):]

    def answer(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise ConnectionError("the grader closed the relay")
        frame = json.loads(line)
        if frame.get("op") == "stop":
            raise RuntimeError(str(frame.get("message", "stopped by the grader")))
        return frame  # type: ignore[no-any-return]


class Handle:
    """What ``isend`` / ``irecv`` / an ``async_op`` collective return: ``wait()`` it."""

    def __init__(self, finish: Any = None):
        self._finish, self._done = finish, finish is None

    def wait(self) -> None:
        if not self._done:
            self._done = True
            self._finish()

    def is_completed(self) -> bool:
        return self._done


class RelayComm:
    """``ctx.comm`` of a relayed rank: the point-to-point calls and the collectives of
    ``labkit.trace.comm.Comm`` (same names and arguments), carried by the grader."""

    def __init__(self, link: Link, rank: int, world_size: int):
        self.link, self.rank, self.world_size = link, rank, world_size
        self._rid = 0

    def _peer(self, peer: int, what: str) -> int:
        if not isinstance(peer, int) or isinstance(peer, bool) or not 0 <= peer < self.world_size:
            raise ValueError(f"{what} ({peer!r}) must be a rank 0..{self.world_size - 1}")
        if peer == self.rank:
            raise ValueError(f"{what} ({peer}) is this rank itself; send to another rank")
        return peer

    @staticmethod
    def _tag(tag: int) -> int:
        if not isinstance(tag, int) or not 0 <= tag < TAGS:
            raise ValueError(f"tag ({tag!r}) must be an int 0..{TAGS - 1}, e.g. tag=0")
        return tag

    # ---- point to point ------------------------------------------------------------------
    def send(self, tensor: Any, dst: int, *, tag: int = 0, **meta: Any) -> None:
        self.link.post({"op": "send", "peer": self._peer(dst, "dst"), "tag": self._tag(tag),
                        "tensor": pack(tensor)})

    def isend(self, tensor: Any, dst: int, *, tag: int = 0, **meta: Any) -> Handle:
        self.send(tensor, dst, tag=tag)
        return Handle()

    def irecv(self, tensor: Any, src: int, *, tag: int = 0, **meta: Any) -> Handle:
        rid = self._post({"op": "recv", "peer": self._peer(src, "src"), "tag": self._tag(tag),
                          "nbytes": tensor.numel() * tensor.element_size()})
        return Handle(lambda: self._fill(tensor, self._wait(rid)))

    def recv(self, tensor: Any, src: int, *, tag: int = 0, **meta: Any) -> None:
        self.irecv(tensor, src, tag=tag).wait()

    def _post(self, frame: dict[str, Any]) -> int:
        self._rid += 1
        self.link.post({**frame, "rid": self._rid})
        return self._rid

    def _wait(self, rid: int) -> dict[str, Any]:
        self.link.post({"op": "wait", "rid": rid})
        frame = self.link.answer()
        if frame.get("rid") != rid:
            raise RuntimeError(f"the relay answered {frame.get('rid')} while rank "
                               f"{self.rank} waited for {rid}")
        return frame

    @staticmethod
    def _fill(tensor: Any, frame: dict[str, Any]) -> None:
        if "error" in frame:
            raise RuntimeError(str(frame["error"]))
        data = unpack(frame["tensor"])
        if data.numel() * data.element_size() != tensor.numel() * tensor.element_size():
            raise RuntimeError(f"received {data.numel() * data.element_size()} B into a "
                               f"buffer of {tensor.numel() * tensor.element_size()} B")
        flat = data.view(tensor.dtype) if data.dtype != tensor.dtype else data
        with _no_grad():
            tensor.copy_(flat.reshape(tensor.shape))

    # ---- collectives (each rank's part goes to the grader, which combines them) -----------
    def _collective(self, kind: str, tensor: Any, out: Any, *, reduce: str = "sum",
                    root: int | None = None, async_op: bool = False) -> Handle | None:
        rid = self._post({"op": "coll", "kind": kind, "reduce": reduce, "root": root,
                          "tensor": pack(tensor) if tensor is not None else None,
                          "out": 0 if out is None else out.numel() * out.element_size()})

        def finish() -> None:
            frame = self._wait(rid)
            if out is not None:
                self._fill(out, frame)
            elif "error" in frame:
                raise RuntimeError(str(frame["error"]))

        handle = Handle(finish)
        if async_op:
            return handle
        handle.wait()
        return None

    def all_reduce(self, tensor: Any, op: str = "sum", *, async_op: bool = False,
                   **meta: Any) -> Handle | None:
        return self._collective("all_reduce", tensor, tensor, reduce=op, async_op=async_op)

    def reduce_scatter(self, output: Any, input: Any, op: str = "sum", *,
                       async_op: bool = False, **meta: Any) -> Handle | None:
        return self._collective("reduce_scatter", input, output, reduce=op, async_op=async_op)

    def all_gather(self, output: Any, input: Any, *, async_op: bool = False,
                   **meta: Any) -> Handle | None:
        return self._collective("all_gather", input, output, async_op=async_op)

    def broadcast(self, tensor: Any, src: int, *, async_op: bool = False,
                  **meta: Any) -> Handle | None:
        return self._collective("broadcast", tensor, tensor, root=src, async_op=async_op)

    def barrier(self, **meta: Any) -> None:
        self._collective("barrier", None, None)


@contextlib.contextmanager
def _no_grad() -> Iterator[None]:
    import torch

    with torch.no_grad():
        yield


class RelayContext:
    """``ctx`` of a relayed rank: ``rank``, ``world_size``, ``comm``; no process group."""

    def __init__(self, link: Link, rank: int, world_size: int):
        import torch

        self.rank, self.world_size = rank, world_size
        self.local_rank, self.dp_rank, self.dp_size = rank, rank, world_size
        self.device = torch.device("cpu")
        self.comm = RelayComm(link, rank, world_size)
        self._link = link

    @contextlib.contextmanager
    def step(self, case: int) -> Iterator[int]:
        """Mark case ``case`` on the grader's record (its bytes are counted per case)."""
        self._link.post({"op": "step", "case": case, "edge": "begin"})
        try:
            yield case
        finally:
            self._link.post({"op": "step", "case": case, "edge": "end"})


def _job(link: Link, frame: dict[str, Any]) -> dict[str, Any]:
    import cloudpickle
    import torch

    from labkit.grading import rank_side
    from labkit.grading.sandbox.server import _error
    from labkit.grading.sandbox.wire import decode, encode

    torch.set_num_threads(1)
    try:
        fn = cloudpickle.loads(base64.b64decode(frame["blob"]))
        harness = getattr(rank_side, f"{frame['check']}_rank")
        ctx = RelayContext(link, int(frame["rank"]), int(frame["world_size"]))
        result = harness(ctx, fn, *decode(frame["args"]), list(frame.get("forbid", [])))
        return {"op": "done", "result": encode(result)}
    except BaseException as exc:  # noqa: BLE001 (the student's failure is feedback)
        error = _error(exc)
        # the student's own frames only: not the harness's, not torch's internals
        lines = error["traceback"].splitlines()
        keep = [i for i, line in enumerate(lines) if line.startswith("  File ")
                and "/labkit/" not in line and "site-packages" not in line]
        error["traceback"] = "\n".join(line for i in keep for line in lines[i:i + 2])
        return {"op": "done", "error": error}


def serve(rfd: int, wfd: int) -> None:
    """Answer ``init`` like the notebook's server, then run jobs until the pipe closes."""
    link = Link(rfd, wfd)
    owner = os.getpid()
    while True:
        line = link.reader.readline()
        if not line:
            return
        frame = json.loads(line)
        if frame.get("op") == "init":
            link.post({"id": frame["id"], "token": frame["token"], "ok": True})
        elif frame.get("op") == "job":
            reply = _job(link, frame)
            if os.getpid() != owner:  # a fork of the student's came back here
                os._exit(0)
            link.post(reply)


if __name__ == "__main__":
    sys.stdin = open(os.devnull)  # noqa: SIM115 (input() gets EOF, not a hang)
    serve(int(sys.argv[1]), int(sys.argv[2]))
