"""``labkit submit ASSIGNMENT`` and ``labkit course release|check|traces|hub`` (nbgrader).

``submit`` grades the student's notebook with nbgrader exactly as the instructor would and
prints the score per question and the feedback HTML's path (exit 0 graded, 2 bad input,
1 nbgrader failed). ``course release`` regenerates ``exercises/`` from ``solutions/``;
``course grade`` grades every submission on its own (exit 1 when one could not be graded and
scored 0); ``course check`` exits 1 when the committed release is stale; ``course hub`` sets up a
class on one server (:mod:`labkit.grading.hub`).
"""

from __future__ import annotations

import argparse
import json
import sys

from labkit.base.errors import ConfigError, LabError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``submit`` and ``course``; each parser sets ``func=handler`` (returns exit code)."""
    p = subparsers.add_parser(
        "submit", help="grade your exercise notebook locally with nbgrader",
        description="Copy your notebook into course/submitted, run nbgrader autograde and "
                    "generate_feedback, print the score per question and the feedback path.")
    p.add_argument("assignment", help="e.g. ps1_numbers (a folder of solutions/)")
    p.add_argument("--notebook", action="append", default=None, metavar="PATH",
                   help="notebook to submit, whatever its file name (default: "
                        "exercises/ASSIGNMENT/*.ipynb); repeat for several")
    p.add_argument("--student", default="student", help="student id (default: student)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--cell-timeout", type=float, default=None, metavar="S",
                   help="seconds a cell may run before it is stopped (default: "
                        "nbgrader_config.py, 60)")
    p.add_argument("--sandbox", choices=("auto", "bwrap", "unshare", "none"), default=None,
                   help="where your code runs while graded (default: auto, the safest "
                        "this machine has)")
    p.set_defaults(func=_submit)

    c = subparsers.add_parser("course", help="instructor: regenerate or check exercises/")
    sub = c.add_subparsers(dest="course_command", metavar="COMMAND", required=True)
    r = sub.add_parser("release", help="regenerate exercises/ from solutions/ (nbgrader)")
    r.add_argument("assignments", nargs="*", help="default: all")
    r.set_defaults(func=_release)
    g = sub.add_parser("grade", help="instructor: autograde and give feedback to every "
                       "submission, one at a time",
                       description="Autograde each student's submission of ASSIGNMENT in "
                                   "course/submitted/ on its own; one that fails scores 0 "
                                   "with a feedback page saying why, and the rest are still "
                                   "graded. Then generate_feedback per student.")
    g.add_argument("assignment", help="e.g. ps1_numbers")
    g.add_argument("--student", action="append", default=None, metavar="ID",
                   help="grade only this student (repeat for several)")
    g.set_defaults(func=_grade)
    k = sub.add_parser("check", help="exit 1 if exercises/ is stale")
    k.set_defaults(func=_check)
    t = sub.add_parser("traces", help="record problem set 4's timelines (real runs, minutes)",
                       description="Record the public example traces into "
                                   "solutions/ps4_reasoning/traces/ and the hidden ones into "
                                   "solutions/_grading/ps4_traces/ (specs and the analysis "
                                   "that must recover each cause: solutions/_grading/"
                                   "ps4_reasoning.py), then run `labkit course release`.")
    t.add_argument("--only", choices=("public", "hidden"), default=None,
                   help="record only one set (default: both)")
    t.set_defaults(func=_traces)
    _register_hub(sub)


def _register_hub(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    h = sub.add_parser(
        "hub", help="instructor, as root: set up a class on this server (JupyterHub + nbgrader)",
        description="Create the instructor's and the students' users, copy the course into "
                    "the instructor's folder, make nbgrader's exchange, write nbgrader's "
                    "system-wide config and the hub's config, delegate a cgroup for the "
                    "grading boxes, probe the box as the instructor, and print what is and "
                    "is not protected. --serve then starts JupyterHub.")
    h.add_argument("--instructor", default="instructor", help="instructor's user name")
    h.add_argument("--students", required=True, metavar="A,B,...",
                   help="comma-separated user names, or @FILE with one name per line")
    h.add_argument("--passwords", metavar="FILE", default=None,
                   help="user:password lines to set (as chpasswd reads them)")
    for flag, default in (("--course-dir", None), ("--exchange", "/srv/nbgrader/exchange"),
                          ("--hub-dir", "/srv/labkit-hub"), ("--config-dir", "/etc/jupyter")):
        h.add_argument(flag, default=default, metavar="DIR")
    h.add_argument("--ip", default="127.0.0.1", help="address the hub listens on")
    for flag, port in (("--port", 8000), ("--hub-port", 8081), ("--api-port", 8001)):
        h.add_argument(flag, type=int, default=port)
    h.add_argument("--python", default=sys.executable,
                   help="interpreter of the single-user servers (labkit installed in it)")
    h.add_argument("--pythonpath", default="", help="PYTHONPATH of every server (a labkit "
                   "checkout that is not installed)")
    h.add_argument("--cgroup", default="/labkit-grading",
                   help="cgroup folder delegated to the instructor for grading boxes")
    h.add_argument("--server-memory-mb", type=int, default=4096, help="MiB one student's "
                   "server may use with its kernels and ranks (a cgroup per server)")
    h.add_argument("--server-processes", type=int, default=512,
                   help="processes and threads one student's server may hold")
    h.add_argument("--serve", action="store_true", help="then start JupyterHub")
    h.set_defaults(func=_hub)


def _submit(args: argparse.Namespace) -> int:
    from labkit.grading.submit import submit

    def progress(line: str) -> None:  # to stderr: stdout carries only the report / JSON
        print(line, file=sys.stderr, flush=True)

    try:
        result = submit(args.assignment, args.notebook, student=args.student,
                        cell_timeout=getattr(args, "cell_timeout", None),
                        sandbox=getattr(args, "sandbox", None), on_progress=progress)
    except ConfigError as error:
        print(f"labkit submit: error: {error}", file=sys.stderr)
        return 2
    except LabError as error:
        print(f"labkit submit: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json()) if args.json else result.report())
    return 0


def _release(args: argparse.Namespace) -> int:
    from labkit.grading import course

    try:
        for path in course.release(names=args.assignments or None, progress=True):  # stderr
            print(f"released {path}")
    except (ConfigError, RuntimeError) as error:
        print(f"labkit course release: {error}", file=sys.stderr)
        return 2
    return 0


def _grade(args: argparse.Namespace) -> int:
    from labkit.grading import course
    from labkit.grading.classgrade import grade_class

    try:
        course.check_assignment(args.assignment)
        grades = grade_class(args.assignment, names=args.student, progress=True)  # stderr
    except (ConfigError, LabError) as error:
        print(f"labkit course grade: {error}", file=sys.stderr)
        return 2
    for grade in grades:
        print(grade.line())
    if not grades:
        print(f"no submissions of {args.assignment} in course/submitted/")
    return 1 if any(not g.graded for g in grades) else 0


def _check(args: argparse.Namespace) -> int:
    from labkit.grading import course

    stale = course.stale_assignments(progress=True)  # its fresh release counts on stderr
    for name, why in stale.items():
        print(f"stale: {name}: {why} (run `labkit course release`)")
    if not stale:
        print("exercises/ matches solutions/")
    return 1 if stale else 0


def _hub(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from labkit.grading import course, hub

    try:
        names = args.students
        if names.startswith("@"):
            names = ",".join(Path(names[1:]).read_text().split())
        passwords = {}
        if args.passwords:
            for line in Path(args.passwords).read_text().splitlines():
                user, _, word = line.partition(":")
                passwords[user.strip()] = word
        plan = hub.HubPlan(
            instructor=args.instructor, students=tuple(n for n in names.split(",") if n),
            course_dir=Path(args.course_dir) if args.course_dir else None,
            exchange=Path(args.exchange), hub_dir=Path(args.hub_dir),
            config_dir=Path(args.config_dir), ip=args.ip, port=args.port,
            hub_port=args.hub_port, api_port=args.api_port, python=args.python,
            pythonpath=args.pythonpath, cgroup=args.cgroup, passwords=passwords,
            server_memory_mb=args.server_memory_mb, server_processes=args.server_processes)
        for line in hub.setup(plan, course.repo_root()):
            print(line)
    except ConfigError as error:
        print(f"labkit course hub: error: {error}", file=sys.stderr)
        return 2
    except (LabError, OSError) as error:
        print(f"labkit course hub: {error}", file=sys.stderr)
        return 1
    if args.serve:
        sys.stdout.flush()
        os.execv(args.python, [args.python, "-m", "jupyterhub", "-f",
                               str(plan.hub_dir / "jupyterhub_config.py")])
    return 0


def _traces(args: argparse.Namespace) -> int:
    from labkit.grading import course, instructor
    from labkit.grading.traces import TraceSpec, generate

    try:
        root = course.repo_root()
        module = instructor.load("ps4_reasoning", root)
        if module is None:
            raise ConfigError("solutions/_grading/ps4_reasoning.py is missing: traces are "
                              "recorded on the instructor's side only")
        sets = {"public": (module.PUBLIC_TRACES, root / "solutions/ps4_reasoning/traces"),
                "hidden": (module.HIDDEN_TRACES, instructor.folder(root) / "ps4_traces")}
        for name, (specs, folder) in sets.items():
            if args.only not in (None, name):
                continue
            report = generate({k: TraceSpec(kind, rank, world, seed)
                               for k, (kind, rank, world, seed) in specs.items()},
                              folder, module.analyze, progress=True)  # stderr: minutes
            for trace, row in report.items():
                print(f"{name} {trace}: {row}")
    except (ConfigError, LabError) as error:
        print(f"labkit course traces: {error}", file=sys.stderr)
        return 2
    return 0
