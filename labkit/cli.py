"""The ``labkit`` command: doctor, run, list, calc, quiz, submit.

``labkit run STRATEGY`` takes the common flags plus one flag per field of the strategy's
options dataclass (``labkit.config.flags``, shared with the torchrun worker). Exit codes: 0 ok,
1 the run failed (a rank raised, died or hung), 2 bad input, 130 stopped by Ctrl-C (128 +
SIGINT, what a shell reports for an interrupted command) once every rank is gone.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from labkit.base.errors import ConfigError, LabError, RankFailure, RunFailed
from labkit.config.flags import add_run_flags, dash_values, run_flags_parser

INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C."""

# Subcommands contributed by other modules: each has ``register(subparsers)``.
_PLUGINS = ("labkit.theory.cli", "labkit.theory.plan_cli", "labkit.quiz.cli", "labkit.grading.cli")


def _run_command(args: argparse.Namespace, extra: list[str]) -> int:
    from labkit.config.flags import config_from_args
    from labkit.launchers.jobs import check_local
    from labkit.launchers.output import fail_input, fail_run, output_problems, report, save_partial

    try:
        config = config_from_args(args, extra)
        problems = output_problems(args)  # before any process starts: never lose a result
        try:
            check_local(config)  # world size, working directory, checkpoint directory
        except ConfigError as err:
            problems += err.problems
        if problems:
            raise ConfigError(problems)
    except ConfigError as err:
        return fail_input(args, str(err))
    from labkit.api import run

    try:
        result = run(config)
    except RunFailed as err:
        save_partial(args, err)
        return fail_run(args, err.failure)
    except KeyboardInterrupt:
        fail_run(args, RankFailure(None, "interrupted", "stopped by Ctrl-C; all ranks "
                                   "were terminated"))
        return INTERRUPTED
    return report(args, result)


def _doctor_command(args: argparse.Namespace, extra: list[str]) -> int:
    problems = [f"doctor does not take {' '.join(extra)!r}; its flags are --json, --markdown "
                f"(with --selftest), --selftest and --clean, e.g. labkit doctor --selftest "
                f"--json"] if extra else []
    if args.json and args.markdown:
        problems.append("--json and --markdown are two formats of one table: pick one, e.g. "
                        "labkit doctor --selftest --markdown")
    if args.markdown and not args.selftest:
        problems.append("--markdown prints the self-test's table: add --selftest, e.g. "
                        "labkit doctor --selftest --markdown")
    if args.clean and args.selftest:
        problems.append("--clean and --selftest are two steps: run labkit doctor --clean, "
                        "then labkit doctor --selftest")
    if problems:
        print("labkit: error: " + "; ".join(problems), file=sys.stderr)
        return 2
    if args.selftest:
        return _selftest(args)
    from labkit.doctor import doctor

    report = doctor(clean=args.clean)
    print(json.dumps(report.to_json(), indent=1) if args.json else report)
    return 0


def _selftest(args: argparse.Namespace) -> int:
    """Exit 0 when no row failed (skipped rows say why), 1 when one did."""
    from labkit.selftest import Row, run_selftest

    def progress(row: Row) -> None:  # to stderr: stdout carries only the table / JSON
        print(f"  {row.lesson} {row.check}: {row.verdict}", file=sys.stderr, flush=True)

    print("labkit doctor --selftest: one real check per lesson (about a minute on 2 cores)",
          file=sys.stderr, flush=True)
    try:
        report = run_selftest(on_row=progress, on_start=lambda what: print(
            f"  {what}...", file=sys.stderr, flush=True))
    except KeyboardInterrupt:  # the pool has stopped its ranks on the way out
        print("labkit: interrupted: the self-test stopped, no rank is left", file=sys.stderr)
        return INTERRUPTED
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report.markdown() if args.markdown else report)
    return 0 if report.ok else 1


def _calibrate_command(args: argparse.Namespace, _extra: list[str]) -> int:
    from labkit.analysis.calibrate import MAX_CALL_S, ROUNDS, TRIES, cache_dir, calibrate

    print(f"labkit calibrate: timing torch.mm on square sizes, best of {ROUNDS} rounds each "
          f"(up to {TRIES} tries while the machine is busy; 10-60 s)", file=sys.stderr, flush=True)
    result = calibrate(args.device, refresh=True, tries=TRIES, dtype=args.dtype, progress=True)
    if result is None:
        print("labkit: error: the calibration run failed (is torch installed?)", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
        return 1 if result.get("now_busy") else 0
    gflops = result["peak_flops_per_s"] / 1e9
    if result.get("now_busy"):
        print(f"labkit: error: the machine is busy: {result['now_busy']} ({TRIES} tries). A "
              f"peak measured now would be too low and overstate MFU, so none of it lowers "
              f"the cached peak, which stays {gflops:.1f} GFLOP/s"
              f"{' (from busy measurements only)' if result.get('busy') else ''}. Close "
              f"other programs and run `labkit calibrate` again", file=sys.stderr)
        return 1
    print(f"{result['name']}: peak {gflops:.1f} GFLOP/s {args.dtype} matmul (best of "
          f"{len(result['rates'])} shapes: {result['shape']}, {result.get('threads') or 1} "
          f"threads); cached in {cache_dir() / 'peak_flops.json'} as the denominator of MFU")
    if result.get("skipped"):
        print(f"left out, one matmul of each taking over {MAX_CALL_S:g} s at that rate: "
              + ", ".join(f"{shape} (about {secs:.0f} s)"
                          for shape, secs in result["skipped"].items()))
    return 0


def _list_command(args: argparse.Namespace, _extra: list[str]) -> int:
    from labkit.config import registry
    for name in registry.names():
        spec = registry.get(name)
        print(f"{name:<16} {spec.summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("doctor", help="what this machine can run")
    d.add_argument("--json", action="store_true")
    d.add_argument("--clean", action="store_true",
                   help="remove what crashed emulated-cluster runs left (namespaces, processes)")
    d.add_argument("--selftest", action="store_true",
                   help="run one short real check per lesson on this machine's backend and print "
                        "a pass / FAIL / skipped table (the first thing to run on a new server)")
    d.add_argument("--markdown", action="store_true",
                   help="with --selftest: print the table as Markdown (for a ticket)")
    d.set_defaults(handler=_doctor_command)
    r = sub.add_parser("run", help="train a strategy on real ranks",
                       epilog="Strategy options: `labkit run STRATEGY --help` lists them.")
    add_run_flags(r)
    r.set_defaults(handler=_run_command)
    sub.add_parser("list", help="the registered strategies").set_defaults(handler=_list_command)
    c = sub.add_parser("calibrate", help="measure this machine's peak matmul FLOP/s again "
                                         "(the denominator of MFU; run it on a quiet machine)")
    c.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    c.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="the precision: bf16 is the peak a --precision bf16 run's MFU uses")
    c.add_argument("--json", action="store_true")
    c.set_defaults(handler=_calibrate_command)
    for module in _PLUGINS:
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as err:
            if err.name is None or not module.startswith(err.name):
                raise
    return parser


def _strategy_help(argv: list[str]) -> bool:
    """`labkit run ddp --help`: common flags plus that strategy's options."""
    if len(argv) >= 2 and argv[0] == "run" and ("-h" in argv or "--help" in argv):
        from labkit.config import registry
        if registry.lookup(argv[1]) is not None:
            run_flags_parser(argv[1]).print_help()
            return True
    return False


def _dash_values(argv: list[str]) -> list[str]:
    """``labkit run``'s values that start with '-' (``--inject-fault -1:3:raise``) reach
    labkit's rules instead of argparse's "expected one argument" (``flags.dash_values``)."""
    if len(argv) < 2 or argv[0] != "run":
        return argv
    return ["run", *dash_values(argv[1:], run_flags_parser(argv[1]))]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _strategy_help(argv):
        return 0
    argv = _dash_values(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "handler", None) is not None:
        try:
            return int(args.handler(args, extra))
        except LabError as err:
            print(f"labkit: error: {err}", file=sys.stderr)
            return 2
    if getattr(args, "func", None) is not None:  # plugin subcommands: func(args) -> int
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return int(args.func(args))
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
