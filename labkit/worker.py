"""``python -m labkit.worker``: the torchrun entry point, under its documented name.

The worker itself is ``labkit.launchers.torchrun`` (see its docstring for the flags)::

    torchrun --standalone --nproc-per-node 2 -m labkit.worker run ddp --json
"""

import sys

from labkit.launchers.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
