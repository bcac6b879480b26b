"""Entry point of a rank started by the supervisor: ``python -m labkit.launchers.rank_main ...``.

Ranks are plain subprocesses (not ``multiprocessing`` children) so they never re-import the
caller's ``__main__`` script: a student's script needs no ``if __name__ == "__main__"``
guard, and start-up imports only what a rank needs.

Arguments: RUN_DIR RANK WORLD_SIZE RESULT_FD. The job is in RUN_DIR/job.pkl; the rendezvous
file store is RUN_DIR/store; the shared status board is RUN_DIR/board. The start-up
(``start_rank``) and the messages a rank sends (``labkit.launchers.rankmsg``) are shared with the
warm ranks of ``labkit.Pool`` (``labkit.launchers.pool_main``).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
from multiprocessing.connection import Connection
from typing import IO, Any, NoReturn

from labkit.launchers.rankmsg import send_error, send_report


def start_rank(run_dir: str, rank: int, *, die_with_parent: bool = True) -> IO[str]:
    """What every rank does first: leave Ctrl-C to the supervisor, become a child
    subreaper (whatever it starts stays in its tree: ``labkit.launchers.tree``), die with
    the supervisor (PR_SET_PDEATHSIG, and exit now if it is gone already), dump its Python
    stack to RUN_DIR/stack-RANK.txt on SIGUSR1 (what a timeout shows). Returns the stack
    file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor handles Ctrl-C / stop
    from labkit.launchers.tree import become_subreaper

    become_subreaper()
    from labkit.launchers.reaper import PARENT_ENV
    from labkit.launchers.reaper import die_with_parent as arm_death_signal

    parent = os.environ.get(PARENT_ENV)
    if die_with_parent:
        arm_death_signal(int(parent) if parent else None)
    elif parent and os.getppid() != int(parent):
        os._exit(1)  # the supervisor is gone already: nobody will read our result
    stack_file = open(os.path.join(run_dir, f"stack-{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    return stack_file


def meet(run_dir: str, world_size: int) -> tuple[Any, Any]:
    """The run directory's shared status board and rendezvous store (imports torch)."""
    import torch.distributed as dist

    from labkit.launchers.board import Board

    return (Board.open(os.path.join(run_dir, "board"), world_size),
            dist.FileStore(os.path.join(run_dir, "store"), world_size))


def leave(code: int) -> NoReturn:
    """Exit, killing first everything this rank started that still runs (daemons too:
    they are in its tree, it is their subreaper)."""
    from labkit.launchers.tree import kill_tree

    try:
        kill_tree(os.getpid())
    finally:
        os._exit(code)


def fail(conn: Connection, rank: int, exc: BaseException) -> NoReturn:
    """Report ``exc`` up the result pipe (inside the ``except`` block) and exit 1."""
    try:
        send_error(conn, rank, exc)
        conn.close()
    finally:
        leave(1)


def main(argv: list[str]) -> None:
    run_dir, rank, world_size, fd = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    start_rank(run_dir, rank)
    conn = Connection(fd, readable=False)
    try:
        with open(os.path.join(run_dir, "job.pkl"), "rb") as f:
            job = pickle.load(f)
        from labkit.rank.group import limit_threads

        limit_threads(job.threads)
        from labkit.rank.group import run_rank

        board, store = meet(run_dir, world_size)
        report = run_rank(job, rank, world_size, store=store, status=board.status(rank),
                          progress=board.steps(rank), spool_dir=run_dir)
        send_report(conn, report, rank)
        conn.close()
        leave(0)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the supervisor
        fail(conn, rank, exc)


if __name__ == "__main__":
    main(sys.argv[1:])
