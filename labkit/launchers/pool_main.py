"""Entry point of a warm rank of a ``labkit.Pool``: ``python -m labkit.launchers.pool_main ...``.

A pool rank is a supervisor rank (``labkit.launchers.rank_main``) that does not exit after its job:

1. it starts like one (``start_rank``), limits its torch threads and joins the process
   group ONCE, through a FileStore in the pool's directory;
2. it waits for a job on its command pipe: the pickled ``Job`` and the directory to spool
   this job's events to. End of file on that pipe means the pool was closed (or the
   process that held it died): the rank leaves;
3. it runs the job exactly as a fresh rank would (``labkit.rank.group.RankGroup.run``: every
   seed reset, a fresh tracer and comms, clocks aligned) and sends its report by value;
4. a job that raises is reported like a fresh rank's failure, and the rank exits: the pool
   is torn down and rebuilt on the next call, because a failed collective can leave the
   group in any state, with peers still blocked in it;
5. after every job, and whenever it leaves, it kills what the job started and left running
   (a rank is a child subreaper: its daemons are in its tree), so nothing of one job lives
   on into the next.

Dying with the parent: PR_SET_PDEATHSIG fires when the *thread* that started the rank
exits, not the process, so it is armed only when the pool was started from the main
thread (argument DIE_WITH_PARENT); in every case a watchdog thread polls the parent's pid
and leaves the moment the process that started the rank is gone -- also in the middle of a
job, when nobody reads the command pipe.

Arguments: RUN_DIR RANK WORLD_SIZE RESULT_FD COMMAND_FD BACKEND THREADS TIMEOUT_S
DIE_WITH_PARENT (1 or 0).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from multiprocessing.connection import Connection

WATCH_S = 0.2  # how often the watchdog checks that the parent is alive


def _watch_parent(parent: int) -> None:
    from labkit.launchers.rank_main import leave

    while True:
        if os.getppid() != parent:
            leave(1)  # re-parented: the pool's process is gone
        time.sleep(WATCH_S)


def main(argv: list[str]) -> None:
    run_dir, rank, world_size = argv[0], int(argv[1]), int(argv[2])
    out = Connection(int(argv[3]), readable=False)
    commands = Connection(int(argv[4]), writable=False)
    backend, threads, timeout_s = argv[5], int(argv[6]), float(argv[7])
    from labkit.launchers.rank_main import fail, leave, meet, start_rank
    from labkit.launchers.rankmsg import send_report
    from labkit.launchers.tree import kill_tree

    start_rank(run_dir, rank, die_with_parent=argv[8] == "1")
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True,
                     name="labkit-watch-parent").start()
    try:
        # 1. threads, then torch, then the group, once
        from labkit.rank.group import limit_threads

        limit_threads(threads)
        from labkit.rank.group import RankGroup

        board, store = meet(run_dir, world_size)
        group = RankGroup.open(backend, rank, world_size, timeout_s=timeout_s, store=store)
        while True:
            # 2. the next job, or the end
            try:
                spool_dir, job_bytes = pickle.loads(commands.recv_bytes())
            except (EOFError, OSError):
                group.close()
                leave(0)
            job = pickle.loads(job_bytes)
            # 3. run it like a fresh rank
            report = group.run(job, status=board.status(rank), progress=board.steps(rank),
                               spool_dir=spool_dir)
            kill_tree(os.getpid())  # 5. nothing of this job runs on into the next
            send_report(out, report, rank)
    except BaseException as exc:  # noqa: BLE001 - 4. every failure must reach the pool
        fail(out, rank, exc)


if __name__ == "__main__":
    main(sys.argv[1:])
