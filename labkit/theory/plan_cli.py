"""``labkit plan``: rank the layouts of a model on a cluster (``labkit.theory.plan``).

Prints the best layout of each dp x tp x pp shape (memory, step time, tokens/s per GPU,
MFU, what binds it), the top one's terms with their formulas, and why the shapes that lose
do; ``--json`` prints one object. ``--gpu this-machine`` rates the lab's own runs of the
lesson GPT instead (``plan_lab``), on this machine's measured step cost (``plan_local``;
measured on first use by ``python -m labkit.lessons.plan_local``, then cached), fastest
predicted step first. Bad input: one line naming the value, the rule and an example, exit
code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

from labkit.base.cpuload import cpu_count
from labkit.base.errors import ConfigError
from labkit.theory.activations import RECOMPUTE
from labkit.theory.plan import by_shape, plan
from labkit.theory.plan_lab import rank_lab
from labkit.theory.plan_local import StepCost, load_cost
from labkit.theory.plan_models import GPUS, MODELS, Training, cluster, get_gpu, get_model

HERE = "this-machine"
"""``--gpu`` for the lab's own layouts on this machine's measured step cost."""

_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_tokens(text: str) -> float:
    """``16M`` -> 16 x 2**20 tokens (token batches are counted in powers of two: Llama 3's
    "16M" is 2048 sequences of 8192); plain numbers (``16777216``, ``4e6``) as written."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgG]?)\s*", str(text))
    if not match:
        raise ConfigError(f"--global-batch-tokens ({text!r}) must be a positive number of tokens, "
                          f"optionally with K, M or G (powers of 2**10); e.g. "
                          f"--global-batch-tokens 16M")
    value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if value <= 0:
        raise ConfigError(f"--global-batch-tokens ({text!r}) must be > 0; e.g. 16M")
    return value


def _positive(flag: str, text: str, example: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{flag} ({text!r}) must be a whole number >= 1; e.g. {flag} {example}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``plan`` to ``subparsers``; it sets ``func=handler``."""
    p = subparsers.add_parser(
        "plan", help="rank parallel layouts of a model on a cluster (memory, time, MFU)",
        description="Predict memory per GPU, step time, tokens/s and MFU of every layout, "
                    "term by term, and rank those that fit.")
    p.add_argument("--model", default=None, help=f"one of {', '.join(MODELS)} (default "
                   "llama3-8b)")
    p.add_argument("--gpus", default=None, help="number of GPUs (default 8; with --gpu "
                   f"{HERE}: ranks, default every layout)")
    p.add_argument("--gpu", default="h100-sxm", help=f"one of {', '.join(GPUS)}, or {HERE}: "
                   "the lab's own layouts on this machine, measured")
    p.add_argument("--gpus-per-node", default="8", help="GPUs per node (default 8)")
    p.add_argument("--seq", default=None, help="sequence length (default: the model's)")
    p.add_argument("--global-batch-tokens", default="4M", help="tokens per step, e.g. 16M")
    p.add_argument("--recompute", default=None, help=f"one of {', '.join(RECOMPUTE)} "
                   "(default: the cheapest that fits)")
    p.add_argument("--top", default="5", help="shapes to list (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    def handler(args: argparse.Namespace) -> int:
        try:
            text, data = _run(args)
        except ConfigError as error:
            print(f"{p.prog}: error: {error}", file=sys.stderr)
            return 2
        print(json.dumps(data) if args.json else text)
        return 0

    p.set_defaults(func=handler)


def _run(args: argparse.Namespace) -> tuple[str, dict[str, object]]:
    if args.gpu == HERE:
        return _run_here(args)
    model = get_model(args.model or "llama3-8b")
    if args.seq is not None:
        model = model.with_seq(_positive("--seq", args.seq, "8192"))
    get_gpu(args.gpu)
    net = cluster(args.gpu, _positive("--gpus", args.gpus or "8", "1024"),
                  _positive("--gpus-per-node", args.gpus_per_node, "8"))
    training = Training(global_batch_tokens=parse_tokens(args.global_batch_tokens),
                        recompute=args.recompute)
    top = _positive("--top", args.top, "5")
    shapes = by_shape(plan(model, net, training))
    lines = [f"{model.name} ({model.params / 1e9:.1f}B params, seq {model.seq}) on {net.gpus} x "
             f"{net.gpu.name} ({net.per_node} per node, {net.intra.name} / {net.inter.name}), "
             f"{training.global_batch_tokens:.4g} tokens per step",
             f"{'#':>3} {'layout':<72} {'GB/GPU':>7} {'step s':>8} {'tok/s/GPU':>10} "
             f"{'MFU':>6}  binding"]
    for i, q in enumerate(shapes[:top], 1):
        mem = f"{q.memory_bytes / 1e9:.1f}" + ("" if q.fits else "!")
        lines.append(f"{i:>3} {q.layout.label():<72} {mem:>7} {q.step_s:>8.2f} "
                     f"{q.tokens_per_s_per_gpu:>10.1f} {q.mfu:>6.1%}  {q.binding}")
    best = shapes[0]
    lines.append(f"\nTerms of #1 ({'fits' if best.fits else 'does not fit'}):")
    for term in best.memory:
        lines.append(f"  memory {term.name:<11} {term.value / 1e9:>8.2f} GB  {term.formula} "
                     f"[{term.source}]")
    for term in best.time:
        lines.append(f"  time   {term.name:<11} {term.value:>8.3f} s   {term.formula} "
                     f"[{term.source}]")
    losers = shapes[top:top + 5]
    if losers:
        lines.append("\nWhy others lose:")
        lines += [f"  {q.layout.label()}: {q.binding}" for q in losers]
    data = {"model": model.name, "gpus": net.gpus, "gpu": net.gpu.name,
            "global_batch_tokens": training.global_batch_tokens,
            "layouts": [q.to_json() for q in shapes[:top]]}
    return "\n".join(lines), data


def here_cost() -> StepCost:
    """This machine's cached step cost; measured first (in a fresh process: the lab's runs
    need torch, the planner does not) where none is cached."""
    cost = load_cost(cpu_count())
    if cost is None:
        print("labkit plan: measuring this machine's step (one-rank runs of the lesson GPT at "
              "6 sizes, and the collectives; about a minute, cached after)", file=sys.stderr)
        done = subprocess.run([sys.executable, "-m", "labkit.lessons.plan_local"],
                              stdout=subprocess.DEVNULL, check=False)
        cost = load_cost(cpu_count()) if done.returncode == 0 else None
    if cost is None:
        raise ConfigError("this machine's step cost could not be measured; run `python -m "
                          "labkit.lessons.plan_local --refresh` to see why, e.g. on a quiet "
                          "machine")
    return cost


def _run_here(args: argparse.Namespace) -> tuple[str, dict[str, object]]:
    """The lab's layouts on this machine, fastest predicted step first."""
    for flag, value in (("--model", args.model), ("--seq", args.seq),
                        ("--recompute", args.recompute)):
        if value is not None:
            raise ConfigError(f"{flag} ({value!r}) does not apply to --gpu {HERE}: it rates "
                              f"the lab's own runs of the lesson GPT; e.g. labkit plan --gpu "
                              f"{HERE} --gpus 4")
    ranks = None if args.gpus is None else _positive("--gpus", args.gpus, "4")
    cost = here_cost()
    pairs = rank_lab(cost, ranks)
    lines = [f"the lesson GPT's layouts on this machine ({cost.cores} cores): step = "
             f"{cost.step_s * 1e3:.2f} ms + {cost.layer_s * 1e3:.2f} ms per layer per "
             f"microbatch + FLOPs / {cost.flops_per_s / 1e9:.2f} GFLOP/s per rank, fitted "
             f"within {cost.worst_residual:.0%} ({cost.load}); all-reduce alpha "
             f"{cost.alpha_s * 1e6:.0f} us, {cost.bandwidth_Bps / 1e9:.2f} GB/s",
             f"{'#':>3} {'layout':<24} {'ranks':>5} {'step ms':>8}  largest terms"]
    for i, (lay, q) in enumerate(pairs, 1):
        big = sorted(q.time, key=lambda t: -t.value)[:3]
        terms = ", ".join(f"{t.name} {t.value * 1e3:.1f}" for t in big if t.value > 0)
        lines.append(f"{i:>3} {lay.name:<24} {lay.ranks:>5} {q.step_s * 1e3:>8.1f}  {terms}")
    lay, best = pairs[0]
    lines.append(f"\nTerms of #1 ({lay.name}):")
    lines += [f"  time   {t.name:<9} {t.value * 1e3:>8.2f} ms  {t.formula} [{t.source}]"
              for t in best.time]
    data = {"model": "lesson-gpt", "gpu": HERE, "cores": cost.cores, "step_cost": cost.to_json(),
            "layouts": [{"name": lay.name, "strategy": lay.strategy, "ranks": lay.ranks,
                         **q.to_json()} for lay, q in pairs]}
    return "\n".join(lines), data
