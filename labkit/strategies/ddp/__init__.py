"""Torch's DistributedDataParallel as a strategy (lesson 01): ``labkit run ddp``.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.ddp.options import (
    DDPOptions,
)

__all__ = ["DDPOptions"]
