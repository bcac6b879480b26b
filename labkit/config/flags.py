"""The flags of ``labkit run`` and what they turn into, for every front end that takes them.

``labkit run`` (``labkit.cli``), the torchrun worker (``labkit.worker``) and the other
launchers accept the same command line: the common flags below plus one flag per field of
the strategy's options dataclass (``--bucket-cap-mb`` for ddp, ``--schedule`` for
pipeline, ...), generated from the dataclass so no front end lags behind a strategy.

* ``add_run_flags(parser)`` / ``option_flags(options_cls)``: the flags;
* ``config_from_args(args, extra)``: the validated ``RunConfig`` (raises ``ConfigError``).

What the front ends print and write with a run's result is ``labkit.launchers.output``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from labkit.base.docs import field_docs
from labkit.base.errors import ConfigError


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """The flags every strategy takes (``labkit run STRATEGY --help`` lists them)."""
    from labkit.config.run import MODELS, ModelConfig, RunConfig

    docs, model_docs = field_docs(RunConfig), field_docs(ModelConfig)
    p.add_argument("strategy", help="strategy to run (see `labkit list`)")
    p.add_argument("--world-size", type=numeric_flag, default=None, help=docs["world_size"])
    p.add_argument("--steps", type=numeric_flag, default=None, help=docs["steps"])
    p.add_argument("--backend", default="auto", help=docs["backend"])
    p.add_argument("--timeout", type=real_flag, default=None, help=docs["timeout_s"])
    p.add_argument("--seed", type=numeric_flag, default=0, help=docs["seed"])
    p.add_argument("--batch-size", type=numeric_flag, default=None, help=docs["batch_size"])
    p.add_argument("--lr", type=real_flag, default=None, help=docs["lr"])
    p.add_argument("--optimizer", default=None, help=docs["optimizer"])
    p.add_argument("--model", default="mlp", choices=MODELS, help=model_docs["kind"])
    p.add_argument("--width", type=numeric_flag, default=None, help=model_docs["width"])
    p.add_argument("--depth", type=numeric_flag, default=None, help=model_docs["depth"])
    p.add_argument("--heads", type=numeric_flag, default=None, help=model_docs["heads"])
    p.add_argument("--seq-len", type=numeric_flag, default=None, help=model_docs["seq_len"])
    p.add_argument("--vocab-size", type=numeric_flag, default=None, help=model_docs["vocab_size"])
    p.add_argument("--threads-per-rank", type=numeric_flag, default=None,
                   help=docs["threads_per_rank"])
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
    p.add_argument("--launcher", default="labkit", help=docs["launcher"])
    p.add_argument("--nodes", type=int, default=1, help=docs["nodes"])
    p.add_argument("--link", default=None, metavar="PRESET|RATE[,LATENCY]", help=docs["link"])


def run_flags_parser(strategy: str | None) -> argparse.ArgumentParser:
    """Every flag ``labkit run STRATEGY`` takes: the common ones and the strategy's options
    (for ``--help`` and ``dash_values``; an unknown strategy has only the common ones)."""
    from labkit.config import registry

    spec = registry.lookup(strategy) if strategy else None
    parents = [option_flags(spec.options)] if spec is not None and spec.options is not None else []
    p = argparse.ArgumentParser(prog=f"labkit run {spec.name if spec else 'STRATEGY'}",
                                parents=parents, description=spec.summary if spec else None)
    add_run_flags(p)
    return p


def dash_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--inject-fault -1:3:raise`` rewritten as ``--inject-fault=-1:3:raise``.

    argparse takes a word that starts with ``-`` for an option unless it looks like a
    negative number, and stops with "expected one argument" before labkit can say what
    the rule is (``inject_fault rank (-1) must be >= 0``). So a flag of ``parser`` that takes
    one value, followed by a word that starts with ``-`` and is no flag of ``parser``, gets
    that word as its value; ``RunConfig`` then names the rule it breaks.
    """
    flags: set[str] = set()
    one_value: set[str] = set()
    for action in parser._actions:  # argparse has no public list of a parser's flags
        flags.update(action.option_strings)
        if action.nargs is None and action.option_strings:
            one_value.update(action.option_strings)
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return out + argv[i:]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if word in one_value and nxt is not None and nxt.startswith("-") and nxt != "-" \
                and nxt != "--" and nxt.split("=", 1)[0] not in flags:
            out.append(f"{word}={nxt}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


def numeric_flag(text: str) -> int | float:
    """A numeric flag as written: ``8`` is an int, ``1e20`` / ``2.5`` / ``inf`` a float.

    The flag's rule (integer? finite? in range?) is ``RunConfig``'s to check, so
    ``--seed 1e20`` gets the same message, naming the rule, as ``seed=1e20`` in Python.
    """
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; e.g. 8, 0.05 or 1e-3"
                                         ) from None


def real_flag(text: str) -> float:
    """A real-valued flag (``inf`` and ``nan`` parse: ``RunConfig`` says why they are refused)."""
    value = numeric_flag(text)
    return float(value)


MODEL_FLAGS = ("width", "depth", "heads", "seq_len", "vocab_size")
"""The model's fields that are common flags of every strategy (``--heads`` ...)."""


def option_flags(options_cls: type) -> argparse.ArgumentParser:
    """A parser with one --flag per field of a strategy's options dataclass. A field named
    like a model flag (tp's ``heads``) has no flag of its own: the common flag sets both
    (``config_from_args``)."""
    p = argparse.ArgumentParser(add_help=False)
    docs = field_docs(options_cls)
    hints = typing.get_type_hints(options_cls)
    for f in dataclasses.fields(options_cls):
        if f.name in MODEL_FLAGS:
            continue
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
    from labkit.config import registry
    from labkit.config.run import RunConfig

    options: dict[str, Any] = {}
    spec = registry.lookup(args.strategy)
    if spec is not None and spec.options is not None:
        opts, extra = option_flags(spec.options).parse_known_args(extra)
        options = {k: v for k, v in vars(opts).items() if v is not None}
    if extra:
        raise ConfigError(f"unrecognised argument(s) for `{command} {args.strategy}`: "
                          f"{' '.join(extra)} (see `labkit run {args.strategy} --help`)")
    model_kw = {k: v for k in MODEL_FLAGS if (v := getattr(args, k, None)) is not None}
    if spec is not None and spec.options is not None:  # e.g. tp's blocks take --heads too
        names = {f.name for f in dataclasses.fields(spec.options)}
        options.update({k: v for k, v in model_kw.items() if k in names})
    return RunConfig(
        strategy=args.strategy, world_size=args.world_size if world_size is None else world_size,
        steps=args.steps, backend=args.backend, timeout_s=args.timeout, seed=args.seed,
        batch_size=args.batch_size, lr=args.lr, optimizer=args.optimizer,
        model={"kind": getattr(args, "model", "mlp"), **model_kw},  # type: ignore[arg-type]
        options=options or None, trace=not args.no_trace,
        check_reference=args.check_reference, inject_fault=args.inject_fault,
        threads_per_rank=args.threads_per_rank, progress=args.progress, nodes=args.nodes,
        link=args.link, launcher=args.launcher)
