"""The flags of ``labkit run`` and what they turn into, for every front end that takes them.

``labkit run`` (``labkit.cli``), the torchrun worker (``labkit.worker``) and the other
launchers accept the same command line: the common flags below plus one flag per field of
the strategy's options dataclass (``--bucket-cap-mb`` for ddp, ``--schedule`` for
pipeline, ...), generated from the dataclass so no front end lags behind a strategy.

* ``add_run_flags(parser)`` / ``option_flags(options_cls)``: the flags;
* ``config_from_args(args, extra)``: the validated ``RunConfig`` (raises ``ConfigError``);
* ``describe(result)``: the readable summary ``labkit run`` prints;
* ``report(args, result)`` / ``fail_input`` / ``fail_run`` / ``save_partial``: what every
  front end prints and writes, with the exit codes 0 ok, 1 the run failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from typing import Any

from labkit.docs import field_docs
from labkit.errors import ConfigError, RankFailure, RunFailed


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags every strategy takes (``labkit run STRATEGY --help`` lists them)."""
    from labkit.config import RunConfig

    docs = field_docs(RunConfig)
    p.add_argument("strategy", help="strategy to run (see `labkit list`)")
    p.add_argument("--world-size", type=int, default=2, help=docs["world_size"])
    p.add_argument("--steps", type=int, default=10, help=docs["steps"])
    p.add_argument("--backend", default="auto", help=docs["backend"])
    p.add_argument("--timeout", type=float, default=60.0, help=docs["timeout_s"])
    p.add_argument("--seed", type=int, default=0, help=docs["seed"])
    p.add_argument("--batch-size", type=int, default=32, help=docs["batch_size"])
    p.add_argument("--lr", type=float, default=0.05, help=docs["lr"])
    p.add_argument("--optimizer", default="sgd", help=docs["optimizer"])
    p.add_argument("--width", type=int, default=None, help="hidden units per layer of the MLP")
    p.add_argument("--depth", type=int, default=None, help="hidden layers of the MLP")
    p.add_argument("--threads-per-rank", type=int, default=None, help=docs["threads_per_rank"])
    p.add_argument("--inject-fault", default=None, metavar="RANK:STEP:KIND",
                   help=docs["inject_fault"] + " KIND: raise, exit, kill, hang")
    p.add_argument("--check-reference", action="store_true", help=docs["check_reference"])
    p.add_argument("--no-trace", action="store_true", help="do not record the timeline")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome/Perfetto trace JSON here (open in ui.perfetto.dev)")
    p.add_argument("--timeline", default=None, metavar="FILE",
                   help="write the labkit timeline JSON here (labkit.Timeline.load)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the result")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when the terminal is interactive)")
    p.add_argument("--nodes", type=int, default=1, help=docs["nodes"])
    p.add_argument("--link", default=None, metavar="PRESET|RATE[,LATENCY]", help=docs["link"])


def option_flags(options_cls: type) -> argparse.ArgumentParser:
    """A parser with one --flag per field of a strategy's options dataclass."""
    p = argparse.ArgumentParser(add_help=False)
    docs = field_docs(options_cls)
    hints = typing.get_type_hints(options_cls)
    for f in dataclasses.fields(options_cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        hint = hints.get(f.name)
        if hint is bool:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                           default=default, help=docs.get(f.name))
            continue
        base = next((t for t in (int, float, str) if hint is t or t in typing.get_args(hint)),
                    str)
        if typing.get_origin(hint) in (list, tuple):
            inner = typing.get_args(hint)[0] if typing.get_args(hint) else str
            p.add_argument(flag, dest=f.name, type=inner, nargs="+", default=default,
                           help=docs.get(f.name))
        else:
            p.add_argument(flag, dest=f.name, type=base, default=default, help=docs.get(f.name))
    return p


def config_from_args(args: argparse.Namespace, extra: list[str], *, command: str = "labkit run",
                     world_size: int | None = None) -> Any:
    """The validated ``RunConfig`` these flags describe (``ConfigError`` naming every problem).

    ``extra`` holds the strategy's own flags; ``world_size`` overrides ``--world-size``
    (torchrun decides it).
    """
    from labkit import strategies
    from labkit.config import ModelConfig, RunConfig

    options: dict[str, Any] = {}
    spec = strategies.lookup(args.strategy)
    if spec is not None and spec.options is not None:
        opts, extra = option_flags(spec.options).parse_known_args(extra)
        options = {k: v for k, v in vars(opts).items() if v is not None}
    if extra:
        raise ConfigError(f"unrecognised argument(s) for `{command} {args.strategy}`: "
                          f"{' '.join(extra)} (see `labkit run {args.strategy} --help`)")
    model_kw = {k: v for k, v in (("width", args.width), ("depth", args.depth)) if v is not None}
    return RunConfig(
        strategy=args.strategy, world_size=args.world_size if world_size is None else world_size,
        steps=args.steps, backend=args.backend, timeout_s=args.timeout, seed=args.seed,
        batch_size=args.batch_size, lr=args.lr, optimizer=args.optimizer,
        model=ModelConfig(**model_kw), options=options or None, trace=not args.no_trace,
        check_reference=args.check_reference, inject_fault=args.inject_fault,
        threads_per_rank=args.threads_per_rank, progress=args.progress, nodes=args.nodes,
        link=args.link)


def report(args: argparse.Namespace, result: Any, extra_json: dict[str, Any] | None = None
           ) -> int:
    """Write --trace / --timeline and print the result (--json: one object); exit code 0."""
    if args.trace:
        result.save_trace(args.trace)
    if args.timeline:
        result.timeline.save(args.timeline)
    if args.json:
        print(json.dumps({**result.to_json(), **(extra_json or {})}, default=str), flush=True)
    else:
        print(describe(result), flush=True)
    return 0


def describe(result: Any) -> str:
    """The readable summary of a run that ``labkit run`` prints."""
    m = result.metrics
    lines = [repr(result)]
    if result.losses:
        lines.append(f"  loss          {result.losses[0]:.4f} -> {result.losses[-1]:.4f}")
    for key in ("compute_s", "comm_s", "overlap_fraction", "idle_fraction"):
        if key in m:
            lines.append(f"  {key:<13} {m[key]:.4g}")
    for key, v in m.items():
        if key in ("compute_s", "comm_s", "overlap_fraction", "idle_fraction", "step_time_s",
                   "note"):
            continue
        if isinstance(v, (int, float, str)) or (
                isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
            lines.append(f"  {key:<13} {number(v)}")
    link = m.get("link")
    if isinstance(link, dict) and link.get("measured_bps"):  # runs across emulated nodes
        shaped = f"{link['rate_bps'] / 1e6:g} Mbit/s" if link.get("rate_bps") else "unshaped"
        lines.append(f"  link          {link.get('spec') or 'unshaped'}: {shaped}, measured "
                     f"{link['measured_bps'] / 1e6:.1f} Mbit/s, "
                     f"{link['measured_latency_s'] * 1e6:.0f} us one-way")
    if result.trace_path:
        lines.append(f"  trace         {result.trace_path}  (open in ui.perfetto.dev)")
    if result.params_sha256:
        lines.append(f"  params_sha256 {result.params_sha256}")
    if isinstance(m.get("note"), str):
        lines.append(f"  note: {m['note']}")
    return "\n".join(lines)


def number(v: Any) -> str:
    """Floats to 4 significant digits (lists element by element); anything else as is."""
    if isinstance(v, bool) or not isinstance(v, (float, list)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(number(x) for x in v) + "]"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.4g}"


def fail_input(args: argparse.Namespace, message: str) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"error": {"rank": None, "kind": "config", "message": message,
                                    "traceback": ""}}))
    print(f"labkit: error: {message}", file=sys.stderr)
    return 2


def save_partial(args: argparse.Namespace, err: RunFailed) -> None:
    """--timeline / --trace still write what the ranks recorded before a failure."""
    if err.timeline is None or not err.timeline.events:
        return
    if args.timeline:
        err.timeline.save(args.timeline)
        print(f"labkit: the timeline up to the failure is in {args.timeline}", file=sys.stderr)
    if args.trace:
        err.timeline.to_chrome(args.trace)
        print(f"labkit: the trace up to the failure is in {args.trace}", file=sys.stderr)


def fail_run(args: argparse.Namespace, failure: RankFailure) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"error": failure.to_json()}))
    where = f"rank {failure.rank}" if failure.rank is not None else "the run"
    print(f"labkit: {where} failed ({failure.kind}): {failure.message}", file=sys.stderr)
    if failure.traceback:
        print(f"\n--- {where} ---\n{failure.traceback.rstrip()}", file=sys.stderr)
    return 1
