"""Lesson 05 benchmark: ZeRO stages 0-3 measured against the formulas, in one run.

Prints, for N_d in {2, 4} and stages 0-3 (our implementation, fp32 Adam):
* per-rank model-state bytes measured (storages kept between steps) vs
  ``labkit.theory.zero_memory``: the worst relative error over ranks and terms (bar: 1%),
  and the padding bytes, reported separately;
* communication per step from the trace (ring wire bytes) relative to DDP: torch DDP's
  all-reduce of the same gradients, measured with ``labkit run ddp`` (bar: stages 1-2
  within 2% of 1x, stage 3 within 2% of 1.5x). Deviations come only from padding: each
  layer's buffer is rounded up to a multiple of N_d, so RS/AG move a few extra zeros;
* torch's ZeroRedundancyOptimizer / FSDP2 on the same model;
* bf16 mixed precision and activation checkpointing: saved-activation bytes and median
  step time, with vs without (timings are only meaningful on a quiet machine).

Run: ``.venv/bin/python bench/bench_zero.py`` (about 3-5 minutes on 2 cores).
"""

from __future__ import annotations

import labkit
from labkit.config.run import ModelConfig, RunConfig

MODEL = ModelConfig(width=513, depth=3)  # odd width: padding is exercised
TERMS = ("params", "grads", "optimizer")


def run(world_size: int, steps: int = 4, strategy: str = "zero", model: ModelConfig = MODEL,
        **options: object) -> labkit.RunResult:
    return labkit.run(RunConfig(strategy=strategy, world_size=world_size, steps=steps,
                                optimizer="adam", lr=0.01, model=model, timeout_s=300,
                                options=options or None))


def worst_error(m: dict) -> float:
    return max(abs(r[t] - m["predicted_bytes"][t]) / m["predicted_bytes"][t]
               for r in m["per_rank_bytes"] for t in TERMS)


def main() -> None:
    print(f"model: in {MODEL.in_dim} -> {MODEL.width} x {MODEL.depth} -> {MODEL.out_dim}, "
          f"fp32 Adam (4 B weights, 4 B grads, 8 B optimizer state per parameter)")
    print(f"{'Nd':>3} {'impl':>6} {'stage':>5} {'worst mem err':>14} {'padding B (rank 0)':>20} "
          f"{'comm B/step':>12} {'vs DDP':>7}")
    for n in (2, 4):
        ddp = run(n, strategy="ddp")
        ddp_wire = 2 * (n - 1) / n * ddp.metrics["bytes_per_step"]
        rows = [("labkit", s, {}) for s in range(4)] + [("torch", 1, {}), ("torch", 3, {})]
        for impl, stage, extra in rows:
            m = run(n, stage=stage, impl=impl, **extra).metrics
            pad = sum(m.get("padding_bytes", [dict.fromkeys(TERMS, 0)])[0].values())
            print(f"{n:>3} {impl:>6} {stage:>5} {worst_error(m):>13.3%} {pad:>20} "
                  f"{m['comm_bytes_per_step']:>12.0f} {m['comm_bytes_per_step'] / ddp_wire:>7.3f}")
    print("\nmixed precision and activation checkpointing (Nd=2, stage 2, width 2048 x 4):")
    big = ModelConfig(width=2048, depth=4)
    for precision in ("fp32", "bf16"):
        for ckpt in (False, True):
            r = run(2, steps=6, model=big, stage=2, precision=precision, checkpointing=ckpt)
            m = r.metrics
            print(f"  {precision} checkpointing={ckpt!s:5}: saved activations "
                  f"{m['saved_activation_bytes'][0] / 1e6:7.3f} MB (formula "
                  f"{m['predicted_activation_bytes'] / 1e6:7.3f} MB), model states rank 0 "
                  f"{sum(m['per_rank_bytes'][0].values()) / 1e6:7.2f} MB, step "
                  f"{r.step_time_s * 1e3:7.1f} ms")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
