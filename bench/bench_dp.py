"""Lesson 01 speed claims, measured in one run (rerun on a quiet machine for the record).

1. Our ring all-reduce vs gloo's built-in one at 4 MB on 2 ranks: busbw ratio (goal >= 0.5).
2. ddp-naive vs ddp-bucketed vs torch ddp on a deep MLP: step time and overlap fraction
   (goal: bucketed overlaps comm (> 0) and has a shorter step than naive).

Usage: .venv/bin/python bench/bench_dp.py   (about a minute on 2 cores)
"""

from __future__ import annotations

import labkit
from labkit.config.run import ModelConfig


def bench_ring(repeats: int = 3) -> None:
    best: dict[str, float] = {}
    for impl in ("ring", "builtin"):
        for _ in range(repeats):
            r = labkit.run(strategy="allreduce-bench", world_size=2, progress=False,
                           options={"impl": impl, "sizes": ["4MB"], "iters": 20, "warmup": 3})
            bw = r.metrics["results"][0]["busbw_gbps"]
            best[impl] = max(best.get(impl, 0.0), bw)
        print(f"allreduce 4MB n=2 {impl:8s} busbw {best[impl]:.3f} GB/s (best of {repeats})")
    print(f"RATIO ring/builtin busbw at 4MB, n=2: {best['ring'] / best['builtin']:.2f} "
          f"(goal >= 0.5)")


def bench_ddp() -> None:
    model = ModelConfig(width=1024, depth=8)
    rows = {}
    for name, opts in (("ddp-naive", None), ("ddp-bucketed", {"bucket_cap_mb": 4.0}),
                       ("ddp", {"bucket_cap_mb": 4.0})):
        r = labkit.run(strategy=name, world_size=2, steps=12, batch_size=64, model=model,
                       options=opts, progress=False, timeout_s=300)
        m = r.metrics
        rows[name] = (r.step_time_s, m["overlap_fraction"])
        print(f"{name:13s} step {r.step_time_s * 1e3:7.1f} ms  overlap {m['overlap_fraction']:.2f}"
              f"  compute {m['compute_s']:.3f} s  comm {m['comm_s']:.3f} s  "
              f"buckets {m['buckets']}")
    print(f"RATIO ddp-naive / ddp-bucketed step time: "
          f"{rows['ddp-naive'][0] / rows['ddp-bucketed'][0]:.2f} (goal > 1); "
          f"bucketed overlap {rows['ddp-bucketed'][1]:.2f} (goal > 0)")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    bench_ring()
    bench_ddp()
