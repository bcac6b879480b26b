"""Benchmark for lesson 06: is the fitted "this machine" preset right, and what does compression buy?

Prints, in one run on real ranks:
  1. all-reduce times at 8 sizes (``allreduce-bench``), the alpha-beta fit on 4 of them and
     the relative error at the 4 held-out sizes (bar: within 20%);
  2. per compression method: wire bytes per step (measured vs predicted), reduction ratio,
     median step time and final loss on the same seeded task.
Run on a quiet machine: ``.venv/bin/python bench/bench_comm.py [--world-size 2]``.
"""

from __future__ import annotations

import argparse

from labkit.config.run import ModelConfig
from labkit.lessons import compression as ex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    n = args.world_size
    # 1. fit on even-indexed sizes, validate on the odd (held-out) ones
    sizes, times = ex.measure_allreduce(
        ("1MB", "2MB", "4MB", "8MB", "16MB", "32MB", "64MB", "128MB"), world_size=n,
        iters=args.iters, timeout_s=300)
    report = ex.fit_and_validate(sizes, times, n)
    fit = report["fit"]
    print(f"this machine (n={n}): alpha {fit.alpha_s * 1e6:.2f} us, bandwidth "
          f"{fit.bandwidth_Bps / 1e9:.3f} GB/s, R^2 {fit.r_squared:.4f}")
    for r in report["rows"]:
        print(f"  {r['bytes'] / 1e6:6.0f} MB  measured {r['measured_s'] * 1e3:8.3f} ms  "
              f"predicted {r['predicted_s'] * 1e3:8.3f} ms  error {r['rel_error']:6.1%}  "
              f"{'fit' if r['used_for_fit'] else 'held out'}")
    worst = report["max_holdout_error"]
    print(f"worst held-out error: {worst:.1%} ({'within' if worst <= 0.2 else 'OUTSIDE'} 20%)")
    # 2. compression trade-off on one seeded task
    comp = ex.compare_compression(("none", "fp16", "bf16", "powersgd", "topk"), world_size=n,
                                  steps=20, model=ModelConfig(in_dim=256, width=1024, depth=3),
                                  timeout_s=300)
    print("method     wire B/step   predicted    ratio   step ms   final loss")
    for r in comp["rows"]:
        print(f"{r['method']:9s} {r['wire_bytes']:12.0f} {r['predicted_wire_bytes']:11.0f} "
              f"{r['ratio']:7.2f}x {r['step_time_s'] * 1e3:8.2f} {r['final_loss']:11.4f}")


if __name__ == "__main__":
    main()
