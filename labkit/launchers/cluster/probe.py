"""Measure the link itself: round-trip time and TCP goodput between two emulated nodes.

What ``ping`` and ``iperf3`` would tell you, in 60 lines of Python so it needs no extra
package: a server on node 1 and a client on node 0 (each started inside its namespace with
``ip netns exec``) share one TCP connection with Nagle off (TCP_NODELAY).

1. **latency**: ``PINGS`` one-byte ping-pongs; the median round trip / 2 is the one-way
   latency (the alpha of the alpha-beta model, plus this machine's own TCP stack time);
2. **bandwidth**: the client streams for ``seconds`` (at least 20 round trips); the
   receiver timestamps every chunk and reports the rate over all bytes after the first 20%
   (TCP slow start and the token bucket's initial burst would distort a short transfer).

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
        marks: list[tuple[float, int]] = []
        total = 0
        while True:  # 2. receive and timestamp the stream
            n = conn.recv_into(buf)
            if not n:
                break
            total += n
            marks.append((time.monotonic(), total))
    if total == 0:
        return {"rtt_s": 0.0, "goodput_Bps": 0.0, "bytes": 0, "seconds": 0.0}
    t_end, b_end = marks[-1]
    t_start, b_start = next(m for m in marks if m[1] >= SKIP * total)
    seconds = t_end - t_start
    rate = (b_end - b_start) / seconds if seconds > 0 else 0.0
    return {"goodput_Bps": rate, "bytes": total, "seconds": seconds}


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
