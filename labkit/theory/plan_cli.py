"""``labkit plan``: rank the layouts of a model on a cluster (``labkit.theory.plan``).

Prints the best layout of each dp x tp x pp shape (memory, step time, tokens/s per GPU,
MFU, what binds it), the top one's terms with their formulas, and why the shapes that lose
do; ``--json`` prints one object. Bad input: one line naming the value, the rule and an
example, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from labkit.base.errors import ConfigError
from labkit.theory.activations import RECOMPUTE
from labkit.theory.plan import by_shape, plan
from labkit.theory.plan_models import GPUS, MODELS, Training, cluster, get_gpu, get_model

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
    p.add_argument("--model", default="llama3-8b", help=f"one of {', '.join(MODELS)}")
    p.add_argument("--gpus", default="8", help="number of GPUs (default 8)")
    p.add_argument("--gpu", default="h100-sxm", help=f"one of {', '.join(GPUS)}")
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
    model = get_model(args.model)
    if args.seq is not None:
        model = model.with_seq(_positive("--seq", args.seq, "8192"))
    get_gpu(args.gpu)
    net = cluster(args.gpu, _positive("--gpus", args.gpus, "1024"),
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
