"""Measure the link itself: round-trip time and TCP goodput between two emulated nodes.

What ``ping`` and ``iperf3`` would tell you, in 60 lines of Python so it needs no extra
package: a server on node 1 and a client on node 0 (each started inside its namespace with
``ip netns exec``) share one TCP connection with Nagle off (TCP_NODELAY).

1. **latency**: ``PINGS`` one-byte ping-pongs; the median round trip / 2 is the one-way
   latency (the alpha of the alpha-beta model, plus this machine's own TCP stack time);
2. **bandwidth**: the client streams for ``seconds`` (at least 20 round trips); the
   receiver timestamps every read and reports the rate over the bytes after the first 20%
   (TCP slow start and the token bucket's initial burst would distort a short transfer),
   between reads that *drained* the socket (``goodput``): a read shorter than its buffer
   took every byte that had arrived, so its timestamp lies on the arrival curve. A receiver
   that waited for a core at either end of the window reads late, in full buffers; timing
   from those reads would charge its wait to the link.

Each side prints one JSON object: the client ``rtt_s``; the server ``goodput_Bps``,
``bytes`` and ``seconds`` (of the measured part).
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time

PINGS = 20
CHUNK = 256 * 1024
SKIP = 0.2  # share of the bytes ignored at the start of the transfer


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            raise ConnectionError("peer closed the probe connection")
        data += part
    return data


def serve(host: str, port: int) -> dict[str, float]:
    """Node 1's side: echo the pings, then time the stream until the client closes."""
    with socket.create_server((host, port)) as server:
        server.settimeout(30)
        conn, _ = server.accept()
    with conn:
        conn.settimeout(60)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(PINGS):  # 1. echo
            conn.sendall(_recv_exact(conn, 1))
        buf = bytearray(CHUNK)
        marks: list[tuple[float, int, bool]] = []
        total = 0
        while True:  # 2. receive and timestamp the stream
            n = conn.recv_into(buf)
            if not n:
                break
            total += n
            marks.append((time.monotonic(), total, n < CHUNK))
    return goodput(marks)


def goodput(marks: list[tuple[float, int, bool]]) -> dict[str, float]:
    """The stream's rate from the receiver's reads ``(time, bytes so far, drained)``.

    Reads are never early, only late: a read's bytes so far never exceed what had arrived by
    its time. A read that ``drained`` the socket (it returned less than its buffer) took
    everything that had arrived, so it lies on the arrival curve; and while more data follows
    it, on the curve's rising part (the last read may come late, after the stream ended:
    where the curve is flat). The rate is taken between the first such read past ``SKIP`` of
    the bytes and the last one; with fewer than two of them, between the first read past
    ``SKIP`` and the last read (the old, stall-sensitive way). ``drained_reads``: how many
    reads the rate could use.
    """
    total = marks[-1][1] if marks else 0
    if total == 0:
        return {"goodput_Bps": 0.0, "bytes": 0, "seconds": 0.0, "drained_reads": 0}
    past = [m for m in marks if m[1] >= SKIP * total]
    on_curve = [m for m in past[:-1] if m[2]]
    ends = (on_curve[0], on_curve[-1]) if len(on_curve) >= 2 else (past[0], past[-1])
    seconds = ends[1][0] - ends[0][0]
    rate = (ends[1][1] - ends[0][1]) / seconds if seconds > 0 else 0.0
    return {"goodput_Bps": rate, "bytes": total, "seconds": seconds,
            "drained_reads": len(on_curve)}


def send(host: str, port: int, seconds: float) -> dict[str, float]:
    """Node 0's side: ping, then stream for ``seconds``; returns the median round trip."""
    deadline = time.monotonic() + 10
    while True:  # the server may still be starting
        try:
            conn = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            conn.sendall(b"p")
            _recv_exact(conn, 1)
            rtts.append(time.perf_counter() - t0)
        data = b"\0" * CHUNK
        # at least 20 round trips: on a long link slow start needs several of them
        stop = time.monotonic() + max(seconds, 20 * statistics.median(rtts))
        while time.monotonic() < stop:
            conn.sendall(data)
    return {"rtt_s": statistics.median(rtts[2:])}  # the first pings pay for ARP and caches


def main(argv: list[str]) -> int:
    role, host, port = argv[0], argv[1], int(argv[2])
    out = serve(host, port) if role == "serve" else send(host, port, float(argv[3]))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
