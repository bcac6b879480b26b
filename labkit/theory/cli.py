"""``labkit calc``: the theory calculators from a terminal.

Subcommands: ``memory`` (ZeRO bytes per rank, Rajbhandari et al. 2020), ``bubble``
(pipeline bubble, GPipe / 1F1B / interleaved), ``lr`` (global batch, LR scaling and
warmup, Goyal et al. 2017) and ``allreduce`` (ring all-reduce bytes and alpha-beta time
on a preset link). Each prints a short readable report, or one JSON object with ``--json``.
Bad values print one line to stderr naming the value and exit with code 2, as argparse does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from labkit.base.errors import ConfigError
from labkit.theory.batch import DECAYS, LR_RULES, global_batch, lr_at_step, scaled_lr
from labkit.theory.comm import (
    busbw,
    naive_allreduce_bytes,
    ring_allreduce_bytes,
    ring_allreduce_time,
)
from labkit.theory.interconnect import INTERCONNECTS
from labkit.theory.memory import OPTIMIZERS, PRECISIONS, zero_memory
from labkit.theory.pipeline import SCHEDULES, bubble_fraction, pipeline_peak_activations

GB, GIB, MB = 1e9, 2.0**30, 1e6


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calc`` and its subcommands to ``subparsers``; each sets ``func=handler``."""
    calc = subparsers.add_parser(
        "calc", help="theory calculators (memory, bubble, lr, allreduce)",
        description="Pure calculators: the predictions shown next to measured runs.")
    sub = calc.add_subparsers(dest="calculator", metavar="CALCULATOR", required=True)

    p = sub.add_parser("memory", help="ZeRO model-state bytes per rank")
    p.add_argument("--params", type=float, required=True, help="parameter count, e.g. 7.5e9")
    p.add_argument("--dp", type=int, default=1, help="data-parallel ranks (default 1)")
    p.add_argument("--zero-stage", type=int, default=0, help="ZeRO stage 0-3 (default 0)")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    _finish(p, _memory)

    p = sub.add_parser("bubble", help="pipeline bubble fraction")
    p.add_argument("--stages", type=int, required=True, help="pipeline stages p")
    p.add_argument("--microbatches", type=int, required=True, help="microbatches m")
    p.add_argument("--schedule", choices=SCHEDULES, default="gpipe")
    p.add_argument("--virtual", type=int, default=1, help="chunks per rank (interleaved)")
    _finish(p, _bubble)

    p = sub.add_parser("lr", help="global batch, scaled LR and warmup")
    p.add_argument("--per-device-batch", type=int, required=True)
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--base-lr", type=float, required=True, help="LR tuned at --base-batch")
    p.add_argument("--base-batch", type=int, help="batch the base LR was tuned for "
                   "(default: the global batch, i.e. no scaling)")
    p.add_argument("--rule", choices=LR_RULES, default="linear")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--step", type=int, help="also print the LR at this step")
    p.add_argument("--total-steps", type=int)
    p.add_argument("--decay", choices=DECAYS, default="none")
    p.add_argument("--min-lr", type=float, default=0.0)
    _finish(p, _lr)

    p = sub.add_parser("allreduce", help="ring all-reduce bytes and time on a link")
    p.add_argument("--size-mb", type=float, required=True, help="tensor size in MB (1e6 B)")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--link", choices=sorted(INTERCONNECTS), default="pcie4")
    p.add_argument("--alpha-us", type=float, help="override the link's latency (us)")
    p.add_argument("--bandwidth-gbs", type=float, help="override its bandwidth (GB/s)")
    _finish(p, _allreduce)


def _finish(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], Any]) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handler(args: argparse.Namespace) -> int:
        try:
            result = body(args)
        except ConfigError as error:
            print(f"{parser.prog}: error: {error}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(result["json"]))
        else:
            print(result["text"])
        return 0

    parser.set_defaults(func=handler)


def _memory(args: argparse.Namespace) -> dict[str, Any]:
    per_rank = zero_memory(args.params, args.dp, args.zero_stage, args.precision,
                           args.optimizer)
    lines = [(f"ZeRO stage {args.zero_stage}, {args.precision} precision, {args.optimizer}, "
              f"{args.params:.3g} params, dp={args.dp}: model-state bytes per rank"),
             f"{'term':<10} {'GB (1e9)':>12} {'GiB':>12}"]
    lines += [f"{term:<10} {value / GB:>12.2f} {value / GIB:>12.2f}"
              for term, value in per_rank.items()]
    lines.append("(activations not included)")
    data = {"params": args.params, "dp": args.dp, "stage": args.zero_stage,
            "precision": args.precision, "optimizer": args.optimizer,
            "bytes_per_rank": per_rank}
    return {"text": "\n".join(lines), "json": data}


def _bubble(args: argparse.Namespace) -> dict[str, Any]:
    p, m, v = args.stages, args.microbatches, args.virtual
    total = bubble_fraction(p, m, args.schedule, v, "total")
    ideal = bubble_fraction(p, m, args.schedule, v, "ideal")
    vm, mv = (f"{v}*{m}", "v*m") if v > 1 else (f"{m}", "m")
    vm_, mv_ = (f"({vm})", f"({mv})") if v > 1 else (vm, mv)  # parenthesised divisors
    lines = [f"Pipeline: {p} stages, {m} microbatches, schedule {args.schedule}"
             + (f", {v} chunks per rank" if v > 1 else ""),
             (f"Bubble as share of total step time (p-1)/({mv}+p-1): "
              f"{p - 1}/({vm}+{p - 1}) = {total:.1%}"),
             f"Bubble relative to ideal compute (p-1)/{mv_}: {p - 1}/{vm_} = {ideal:.1%}"]
    data: dict[str, Any] = {"stages": p, "microbatches": m, "schedule": args.schedule,
                            "virtual": v, "bubble_total": total, "bubble_ideal": ideal}
    if args.schedule != "interleaved":
        peak = pipeline_peak_activations(p, m, args.schedule, 0)
        lines.append(f"Stage 0 holds activations of {peak} microbatch(es) at its peak")
        data["stage0_peak_microbatches"] = peak
    return {"text": "\n".join(lines), "json": data}


def _schedule_problems(args: argparse.Namespace) -> list[str]:
    """The LR schedule's flags agree with each other, whether or not --step asks for a value:
    warmup is part of the schedule, so it must end before the last step."""
    problems = []
    if args.warmup_steps < 0:
        problems.append(f"--warmup-steps ({args.warmup_steps}) must be >= 0; e.g. "
                        f"--warmup-steps 500")
    if args.total_steps is not None and args.total_steps < 1:
        problems.append(f"--total-steps ({args.total_steps}) must be >= 1; e.g. "
                        f"--total-steps 10000")
    elif args.total_steps is not None and args.warmup_steps >= args.total_steps:
        problems.append(f"--warmup-steps ({args.warmup_steps}) must be less than --total-steps "
                        f"({args.total_steps}): warmup is the first part of the schedule; e.g. "
                        f"--warmup-steps {args.warmup_steps} --total-steps "
                        f"{max(args.warmup_steps, 0) + 1000}")
    return problems


def _lr(args: argparse.Namespace) -> dict[str, Any]:
    problems = _schedule_problems(args)
    if problems:
        raise ConfigError(problems)
    batch = global_batch(args.per_device_batch, args.devices, args.accumulation)
    base_batch = batch if args.base_batch is None else args.base_batch
    target = scaled_lr(args.base_lr, base_batch, batch, args.rule)
    text = f"Global batch: {batch}; Target LR: {target:g}"
    data: dict[str, Any] = {"global_batch": batch, "target_lr": target}
    if args.step is not None:
        lr = lr_at_step(args.step, target_lr=target, warmup_steps=args.warmup_steps,
                        total_steps=args.total_steps, decay=args.decay, min_lr=args.min_lr)
        text += f"; LR at step {args.step}: {lr:g}"
        data.update(step=args.step, lr_at_step=lr)
    return {"text": text, "json": data}


def _allreduce(args: argparse.Namespace) -> dict[str, Any]:
    link = INTERCONNECTS[args.link]
    alpha = link.alpha_s if args.alpha_us is None else args.alpha_us * 1e-6
    bandwidth = link.bandwidth_Bps if args.bandwidth_gbs is None else args.bandwidth_gbs * GB
    if args.size_mb < 0:
        raise ConfigError(f"--size-mb ({args.size_mb:g}) must be >= 0; e.g. --size-mb 100")
    size = args.size_mb * MB
    n = args.world_size
    ring = ring_allreduce_bytes(size, n)
    naive = naive_allreduce_bytes(size, n)
    seconds = ring_allreduce_time(size, n, alpha, bandwidth)
    alg = size / seconds if seconds > 0 else 0.0
    bus = busbw(alg, n, "all_reduce")
    text = "\n".join([
        (f"All-reduce of {args.size_mb:g} MB on {n} ranks over {link.name} "
         f"(alpha {alpha * 1e6:g} us, {bandwidth / GB:g} GB/s per direction)"),
        f"Ring: each rank sends 2(n-1)/n x size = {ring / MB:.2f} MB",
        (f"Naive reduce+broadcast: root sends {naive['root'] / MB:.2f} MB, others "
         f"{naive['non_root'] / MB:.2f} MB"),
        (f"Predicted ring time: {seconds * 1e3:.3f} ms; algbw {alg / GB:.2f} GB/s, "
         f"busbw {bus / GB:.2f} GB/s"),
    ])
    data = {"size_bytes": size, "world_size": n, "link": link.name, "alpha_s": alpha,
            "bandwidth_Bps": bandwidth, "ring_bytes_per_rank": ring,
            "naive_root_bytes": naive["root"], "naive_non_root_bytes": naive["non_root"],
            "time_s": seconds, "algbw_Bps": alg, "busbw_Bps": bus}
    return {"text": text, "json": data}
