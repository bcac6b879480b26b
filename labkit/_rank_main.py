"""Entry point of a rank started by the supervisor: ``python -m labkit._rank_main ...``.

Ranks are plain subprocesses (not ``multiprocessing`` children) so they never re-import the
caller's ``__main__`` script: a student's script needs no ``if __name__ == "__main__"``
guard, and start-up imports only what a rank needs.

Arguments: RUN_DIR RANK WORLD_SIZE RESULT_FD. The job is in RUN_DIR/job.pkl; the rendezvous
file store is RUN_DIR/store; the shared status board is RUN_DIR/board.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection


def _encode_report(report: object, rank: int) -> memoryview:
    """``R`` + the report pickled BY VALUE (cloudpickle): tensors travel as bytes, never as
    shared memory that dies with this process, and classes defined in a notebook come along."""
    import io

    import cloudpickle

    buf = io.BytesIO()
    buf.write(b"R")  # supervisor.RESULT
    try:
        cloudpickle.dump(report, buf, protocol=5)
        return buf.getbuffer()
    except Exception as exc:
        raise TypeError(f"rank {rank} returned a value that cannot be sent to the supervisor "
                        f"({type(exc).__name__}: {exc}); return plain values, numpy arrays or "
                        f"tensors") from exc


def main(argv: list[str]) -> None:
    run_dir, rank, world_size, fd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor handles Ctrl-C / stop
    from labkit.rank import _die_with_parent
    from labkit.reaper import PARENT_ENV

    parent = os.environ.get(PARENT_ENV)
    _die_with_parent(int(parent) if parent else None)
    stack_file = open(os.path.join(run_dir, f"stack-{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    conn = Connection(fd, readable=False)
    try:
        with open(os.path.join(run_dir, "job.pkl"), "rb") as f:
            job = pickle.load(f)
        from labkit.rank import limit_threads

        limit_threads(job.threads)
        import torch.distributed as dist

        from labkit.board import Board
        from labkit.rank import run_rank

        board = Board.open(os.path.join(run_dir, "board"), world_size)
        store = dist.FileStore(os.path.join(run_dir, "store"), world_size)
        report = run_rank(job, rank, world_size, store=store, status=board.status(rank),
                          progress=board.progress(rank), spool_dir=run_dir)
        conn.send_bytes(_encode_report(report, rank))
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the supervisor
        message = f"{type(exc).__name__}: {exc}"
        try:  # plain strings and ints only: this always unpickles in the supervisor
            conn.send_bytes(b"E" + pickle.dumps((rank, time.monotonic_ns(), message,
                                                 traceback.format_exc())))
            conn.close()
        finally:
            sys.stderr.flush()
            os._exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
