"""Tracing overhead: median DDP step time with labkit's tracer on vs off, and vs torch.profiler.

Method: one process group of 2 ranks trains torch DDP on the lesson MLP; blocks of
``--steps`` steps alternate tracer-on / tracer-off (and a torch.profiler block), so drift
on a shared machine hits every variant equally. torch.profiler runs twice: with shapes
only, and with stacks and memory (what people enable to see where time goes).
Steps are timed with a plain clock,
independent of the tracer. Prints the medians and the overhead ratios.

    python bench/bench_tracing.py [--steps 25] [--rounds 4] [--width 512]
"""

from __future__ import annotations

import argparse
import json
import statistics


def _bench(ctx, steps: int, rounds: int, width: int, depth: int) -> dict:
    import time

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from labkit.base.events import Op
    from labkit.config.run import ModelConfig
    from labkit.strategies.ddp.torch_ddp import StepRef, traced_allreduce_hook
    from labkit.train.data import SyntheticTask
    from labkit.train.models import build_mlp
    from labkit.train.training import BackwardClock, traced_backward

    model = build_mlp(ModelConfig(width=width, depth=depth), 0)
    ddp = DistributedDataParallel(model)
    hook_state = StepRef()
    ddp.register_comm_hook(None, traced_allreduce_hook(ctx.comm, hook_state))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    clock = BackwardClock(ddp.parameters())
    task = SyntheticTask(0, 32, 10)
    tr = ctx.tracer
    times: dict[str, list[float]] = {"traced": [], "untraced": [], "torch_profiler": [],
                                     "torch_profiler_full": []}

    def block(step0: int) -> list[float]:
        out = []
        for s in range(step0, step0 + steps):
            t0 = time.perf_counter()
            with ctx.step(s):
                hook_state.now = s
                x, y = task.batch(s, 64, ctx.rank, ctx.world_size)
                opt.zero_grad(set_to_none=True)
                with tr.span(Op.FORWARD, step=s):
                    loss = nn.functional.cross_entropy(ddp(x), y)
                traced_backward(ctx, loss, clock, s)
                with tr.span(Op.OPTIMIZER, step=s):
                    opt.step()
            out.append(time.perf_counter() - t0)
        return out

    step = 0
    block(step)  # warm-up
    step += steps
    variants = list(times)
    for r in range(rounds):
        k = r % len(variants)
        for variant in variants[k:] + variants[:k]:  # rotate: no position bias
            tr.enabled = variant == "traced"
            if variant.startswith("torch_profiler"):
                from torch.profiler import ProfilerActivity, profile

                full = variant == "torch_profiler_full"  # what people turn on to see stacks
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                             with_stack=full, profile_memory=full):
                    times[variant] += block(step)
            else:
                times[variant] += block(step)
            step += steps
    tr.enabled = True
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    args = p.parse_args()
    import labkit

    res = labkit.launch(_bench, 2, args.steps, args.rounds, args.width, args.depth,
                        timeout_s=600)
    merged = {k: [max(a, b) for a, b in zip(res.results[0][k], res.results[1][k])]
              for k in res.results[0]}
    med = {k: statistics.median(v) for k, v in merged.items()}
    out = {"world_size": 2, "steps_per_variant": len(merged["traced"]),
           "median_step_ms": {k: round(v * 1e3, 4) for k, v in med.items()},
           "tracing_overhead": round(med["traced"] / med["untraced"] - 1, 4),
           "torch_profiler_overhead": round(med["torch_profiler"] / med["untraced"] - 1, 4),
           "torch_profiler_full_overhead": round(
               med["torch_profiler_full"] / med["untraced"] - 1, 4)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
