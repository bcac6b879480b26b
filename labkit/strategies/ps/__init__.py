"""A real parameter server (lesson 11): ``labkit run ps --servers S --workers W``.

Ranks ``0..S-1`` are servers, each owning a contiguous shard of the flat parameter vector
and applying the optimizer to it; ranks ``S..S+W-1`` are workers that pull the weights,
compute a gradient on their shard of the step's batch and push it back, over the traced
comm layer (so every push and pull is a span on the timeline, named "push" / "pull", with
the server as peer). The consistency model decides when a pull is answered
(``labkit.strategies.ps.protocol``): BSP, ASP, SSP with staleness s in *clocks* (Ho et al.
2013: ``--consistency ssp --staleness s``; s = 0 paces like BSP) or bounded delay K in
*updates* (Li et al. 2014: ``--consistency bounded-delay --delay K``; labkit's "ssp" before
issue 25). ``--straggler RANK:FACTOR`` makes one
worker's compute FACTOR times longer, to see who waits for whom.

The options, metrics record and registration live in ``options`` (torch-free); this package
re-exports them.
"""

from labkit.strategies.ps.options import (
    CONSISTENCIES,
    DEFAULT_BOUND,
    ELEMENTWISE_OPTIMIZERS,
    MAX_STRAGGLER,
    STRAGGLER_FACTOR,
    PSOptions,
    workers_of,
)

__all__ = ["CONSISTENCIES", "DEFAULT_BOUND", "ELEMENTWISE_OPTIMIZERS", "MAX_STRAGGLER", "PSOptions",
           "STRAGGLER_FACTOR", "workers_of"]
