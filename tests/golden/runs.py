"""The golden runs: one short run per strategy, model, ZeRO stage and compression method,
whose final ``params_sha256`` pins down that a refactoring changed no bit of training.

``python -m tests.golden.runs --record`` runs them all and writes ``params.json``, keyed by
this machine's torch build and CPU instruction set (floating-point kernels differ between
them, so a hash is only comparable on the machine kind that recorded it). The test
(``test_golden_params.py``) runs them again and compares, bit for bit.

Record before a change that should not move any weight; run the test after it. A change
that alters a strategy's model on purpose records the new value and says why in the commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PARAMS_FILE = Path(__file__).with_name("params.json")

COMMON: dict[str, Any] = {"threads_per_rank": 1, "progress": False, "timeout_s": 120.0}
GPT = {"kind": "gpt", "width": 64, "depth": 2, "heads": 4, "seq_len": 32}

RUNS: dict[str, dict[str, Any]] = {
    "ddp-mlp": {"strategy": "ddp", "steps": 5},
    "ddp-gpt": {"strategy": "ddp", "steps": 3, "model": GPT},
    "ddp-digits": {"strategy": "ddp", "steps": 5, "model": "digits"},
    "ddp-naive-mlp": {"strategy": "ddp-naive", "steps": 5},
    "ddp-bucketed-mlp": {"strategy": "ddp-bucketed", "steps": 5},
    "ddp-bucketed-digits": {"strategy": "ddp-bucketed", "steps": 5, "model": "digits"},
    "scaling-rules": {"strategy": "scaling", "steps": 6,
                      "options": {"lr_rule": "linear", "base_batch": 32, "warmup_steps": 2,
                                  "clip_grad_norm": 1.0, "accumulation": 2}},
    "scaling-lars": {"strategy": "scaling", "steps": 4, "optimizer": "lars"},
    "scaling-lamb": {"strategy": "scaling", "steps": 4, "optimizer": "lamb"},
    "compress-fp16": {"strategy": "compress", "steps": 4, "options": {"method": "fp16"}},
    "compress-powersgd": {"strategy": "compress", "steps": 5,
                          "options": {"method": "powersgd", "powersgd_start_step": 2}},
    "compress-topk": {"strategy": "compress", "steps": 4,
                      "options": {"method": "topk", "topk_ratio": 0.1}},
    "compress-randomk": {"strategy": "compress", "steps": 4,
                         "options": {"method": "randomk", "randomk_ratio": 0.1}},
    "compress-int8": {"strategy": "compress", "steps": 4, "options": {"method": "int8"}},
    "zero0-mlp": {"strategy": "zero", "steps": 4, "options": {"stage": 0}},
    "zero1-mlp": {"strategy": "zero", "steps": 4, "options": {"stage": 1}},
    "zero2-mlp": {"strategy": "zero", "steps": 4, "options": {"stage": 2}},
    "zero3-mlp": {"strategy": "zero", "steps": 4, "options": {"stage": 3}},
    "zero3-mlp-4ranks": {"strategy": "zero", "steps": 3, "world_size": 4,
                         "options": {"stage": 3}},
    "zero2-bf16": {"strategy": "zero", "steps": 3, "options": {"stage": 2, "precision": "bf16"}},
    "zero3-gpt": {"strategy": "zero", "steps": 3, "model": GPT, "options": {"stage": 3}},
    "zero1-torch": {"strategy": "zero", "steps": 3, "options": {"stage": 1, "impl": "torch"}},
    "zero3-fsdp2": {"strategy": "zero", "steps": 3, "options": {"stage": 3, "impl": "torch"}},
    "tp-blocks": {"strategy": "tp", "steps": 3},
    "tp-gpt": {"strategy": "tp", "steps": 3, "model": GPT},
    "pipeline-mlp-1f1b": {"strategy": "pipeline", "steps": 3,
                          "options": {"schedule": "1f1b", "microbatches": 4}},
    "pipeline-mlp-zb": {"strategy": "pipeline", "steps": 3,
                        "options": {"schedule": "zb", "microbatches": 4}},
    "pipeline-gpt": {"strategy": "pipeline", "steps": 3, "model": GPT,
                     "options": {"microbatches": 2}},
    "hybrid-dp2-tp2-gpt": {"strategy": "hybrid", "steps": 3, "model": GPT,
                           "options": {"dp": 2, "tp": 2, "microbatches": 2}},
    "hybrid-dp2-zero2-gpt": {"strategy": "hybrid", "steps": 3, "model": GPT,
                             "options": {"dp": 2, "zero_stage": 2, "microbatches": 2}},
    "hybrid-pp2-tp2-gpt": {"strategy": "hybrid", "steps": 3, "model": GPT,
                           "options": {"pp": 2, "tp": 2, "microbatches": 2}},
    "ps-bsp": {"strategy": "ps", "steps": 4,
               "options": {"servers": 1, "workers": 2, "consistency": "bsp"}},
}
"""name -> ``labkit.run`` keyword arguments (with ``COMMON``)."""


def machine_key() -> str:
    """The torch build and CPU instruction set: what decides a run's floating-point bits."""
    import torch

    return f"torch {torch.__version__} / {torch.backends.cpu.get_cpu_capability()}"


def run_one(name: str) -> str | None:
    import labkit

    return labkit.run(**{**COMMON, **RUNS[name]}).params_sha256  # type: ignore[no-any-return]


def recorded() -> dict[str, Any]:
    return json.loads(PARAMS_FILE.read_text()) if PARAMS_FILE.exists() else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="store_true", help="write params.json for this machine")
    p.add_argument("names", nargs="*", help="only these runs (default: all)")
    args = p.parse_args(argv)
    names = args.names or list(RUNS)
    data = recorded()
    table = data.setdefault(machine_key(), {})
    for name in names:
        sha = run_one(name)
        old = table.get(name)
        mark = "" if old is None else (" (same)" if old == sha else f" (was {old})")
        print(f"{name:24s} {sha}{mark}", flush=True)
        if args.record:
            table[name] = sha
    if args.record:
        PARAMS_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
