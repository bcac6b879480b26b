"""``python -m labkit.worker``: the torchrun entry point, under its documented name.

The worker itself is ``labkit.launchers.torchrun`` (see its docstring for the flags)::

    torchrun --standalone --nproc-per-node 2 -m labkit.worker run ddp --json
"""

from labkit.launchers.torchrun import exit_rank, main

if __name__ == "__main__":
    exit_rank(main())  # flushed, then os._exit: no interpreter finalization (see exit_rank)
