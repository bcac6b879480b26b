"""Rank code of ``labkit run ps``: the first S ranks serve, the others work.

The wire protocol (over ``ctx.comm``, gloo; tags in ``protocol``):

* a worker's request is a float64 header ``[kind, step, read_version, loss]`` sent to one
  server, which receives requests from whichever worker sends first (``Comm.recv_any``);
* PULL: the server answers ``[version, shard...]`` (float32) when the consistency gate allows
  (at once for ASP; BSP and SSP may hold the answer back, which is the worker's wait). The
  answer is sent without blocking (``isend``): a server never waits for a worker;
* PUSH: the header is followed by the gradient of the server's shard; the server applies it
  (ASP, SSP) or buffers it until every worker's gradient of the step is in (BSP).
  PUSH_PULL is the same and also asks for the next step's weights, so after its first step a
  worker sends one request per step, not two (Li et al. 2014 combine push and pull alike);
* DONE: the worker finished its steps. A server stops when every worker is done and nothing
  is in flight, then sends its shard to server 0, which hashes the whole model.

A worker pulls from servers 0, 1, ... in order and pushes in the same order, so no two
workers can wait on each other across servers. Workers never talk to each other.
"""

from __future__ import annotations

from labkit.rank.context import RankOutput, RunContext


def train(ctx: RunContext) -> RankOutput:
    """Servers run the server loop; workers run the training skeleton."""
    if ctx.rank < ctx.config.options.servers:
        from labkit.strategies.ps.server import serve

        return serve(ctx)
    from labkit.strategies.ps.worker import PSWorker

    return PSWorker(ctx).run()
