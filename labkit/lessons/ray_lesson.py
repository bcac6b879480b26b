"""Lesson 12's glue: Ray started without noise, and the lesson's sentences read from its runs.

* ``start_ray``: ``labkit.launchers.ray.ensure_ray`` with Ray's token authentication asked
  for explicitly (``RAY_AUTH_MODE=token``: what Ray 2.60 turns on by default for a new local
  cluster, announced by a warning when the mode is left unset; set, Ray keeps quiet), and
  one task per CPU run first, so that a lesson timing tasks times Ray's scheduling, not the
  start of its worker processes (each a fresh Python);
* ``ray_reports``: Ray's driver prints what its error channel publishes (``(raylet) A worker
  died ...``) from a background thread, into whatever cell runs. A lesson that kills
  processes on purpose collects those lines instead and says in one sentence what Ray saw;
* ``resources_text``: what the cluster Ray started offers, in a sentence (its first output);
* ``ray_up``: the kernel's Ray for one block; after the closing cell stopped it (a cell run
  again afterwards), one started for the block and stopped at its end, so no Ray process
  outlives the cell;
* ``tasks_text`` and ``launchers_text``: the timings the lesson states, computed from its run.
Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from labkit.base.devices import cpu_count


def start_ray() -> Any:
    """The ``ray`` module with the lesson's cluster up and its worker processes started."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # Ray's own default, said explicitly
    from labkit.launchers.ray.session import ensure_ray

    ray = ensure_ray()
    cpus = int(ray.cluster_resources().get("CPU", 1))
    ray.get([ray.remote(num_cpus=1)(_pid).remote() for _ in range(cpus)])
    return ray


def resources_text(resources: dict[str, float]) -> str:
    """The cluster's resources (``ray.cluster_resources()``) as the lesson's first sentence."""
    cpus, gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    store = resources.get("object_store_memory", 0) / 1e9
    memory = resources.get("memory", 0) / 1e9
    nodes = sum(1 for k in resources if k.startswith("node:") and k != "node:__internal_head__")
    gpu = f" and {gpus:g} GPU{'s' * (gpus != 1)}" if gpus else " and no GPU"
    return (f"Ray is up: {nodes} node (this machine) offering {cpus:g} CPU{'s' * (cpus != 1)}"
            f"{gpu} to tasks and actors, "
            f"{memory:.1f} GB of memory for their processes and an object store of "
            f"{store:.1f} GB (shared memory) for the values they pass. A task asks for 1 CPU "
            f"by default, so at most {cpus:g} run at once.")


@contextlib.contextmanager
def ray_up(what: str | None = None) -> Iterator[Any]:
    """The ``ray`` module with this kernel's cluster up for the block: the running one, or
    (once ``stop_ray`` has run: a cell run again after the closing cell) one started for the
    block and stopped, with every process it started, when the block ends. ``what``: the
    block's work, said with its time so far once it has lasted two seconds
    (``labkit.base.progress.waiting``)."""
    import sys

    from labkit.base.progress import waiting
    from labkit.launchers.ray import shutdown_ray

    running = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    ray = start_ray()
    try:
        with waiting(what) if what else contextlib.nullcontext():
            yield ray
    finally:
        if not running:
            shutdown_ray()


def _pid() -> int:
    """A task that only starts its worker process (and says which)."""
    return os.getpid()


@contextlib.contextmanager
def ray_reports(settle_s: float = 1.0) -> Iterator[list[str]]:
    """Collect the lines Ray's error channel publishes to this driver while the block runs
    (and for ``settle_s`` after it, as they arrive asynchronously) instead of printing them.
    Other output of Ray passes through unchanged."""
    from ray._private import worker

    original = worker.print_to_stdstream
    seen: list[str] = []

    def collect(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            seen.extend(str(line) for line in data.get("lines", []))
        else:
            original(data, ignore_prefix)

    worker.print_to_stdstream = collect
    try:
        yield seen
        deadline, count = time.monotonic() + settle_s, -1
        while time.monotonic() < deadline and count != len(seen):
            count = len(seen)
            time.sleep(settle_s / 4)
    finally:
        worker.print_to_stdstream = original


def reports_text(lines: Sequence[str]) -> str:
    """One sentence for what Ray reported while processes were killed on purpose."""
    if not lines:
        return "Ray reported nothing on its error channel this time"
    died = sum("died" in line or "killed" in line for line in lines)
    retried = sum("retried" in line or "retries remaining" in line for line in lines)
    first = lines[0].strip().split(". ")[0]
    return (f"Ray reported {len(lines)} line(s) on its error channel, kept out of the way: "
            f"{died} about a process that died (the ones we killed), {retried} about a task "
            f"being retried; the first reads \"{first}.\"")


def tasks_verdict(elapsed_s: float, tasks: int, delay_s: float = 0.2) -> Any:
    """Whether ``tasks`` tasks of ``delay_s`` seconds took the waves of tasks the CPUs allow
    (ceil(tasks / CPUs) x ``delay_s``, within 1.5x): one run, so the measured time carries
    ``labkit.lessons.measure.SINGLE_RUN_NOISE``."""
    from labkit.analysis.claims import Claim, Sample, judge
    from labkit.lessons.measure import SINGLE_RUN_NOISE

    waves = -(-tasks // max(int(cpu_count()), 1))
    return judge(Sample(elapsed_s, elapsed_s * SINGLE_RUN_NOISE, (elapsed_s,)),
                 Claim.within_factor(waves * delay_s, 1.5,
                                     f"Ray runs as many tasks at a time as it has CPUs, so "
                                     f"{tasks} tasks take {waves} wave(s) of {delay_s:g} s"),
                 "seconds to the last task's end", fmt=".2f")


def tasks_text(elapsed_s: float, results: Sequence[dict[str, Any]], delay_s: float = 0.2
               ) -> str:
    """The task timing the lesson states, from the run: serial, parallel on the CPUs,
    measured, and the verdict (``tasks_verdict``); a sleeping task has no CPU time to replay,
    so a miss is explained, not replayed."""
    n, cpus = len(results), int(cpu_count())
    waves = -(-n // max(cpus, 1))
    pids = sorted({r["pid"] for r in results})
    line = (f"{n} tasks of {delay_s:g} s on {cpus} CPUs: {elapsed_s:.2f} s measured; one at a "
            f"time would take {n * delay_s:.1f} s, {cpus} at a time {waves * delay_s:.1f} s; "
            f"they ran in {len(pids)} worker processes {pids}")
    v = tasks_verdict(elapsed_s, n, delay_s)
    line += "\n" + v.sentence()
    if not v.holds:
        line += ("\nRay's scheduler and its worker processes waited for cores other programs "
                 "were using; no dedicated-core replay: a task that sleeps has no CPU time to "
                 "replay, and Ray's calls leave no labkit trace")
    return line


def step_ratio(top: Any, bottom: Any) -> Any:
    """``top``'s steps over ``bottom``'s (first step skipped: warm-up), quartile by quartile,
    as a ``labkit.analysis.claims.Sample``: the ratio of the medians +- half the spread of the
    lower and upper quartiles' ratios. The two runs ran one after the other, so their steps
    pair by nothing but their number: a pair-by-pair ratio of 3 ms steps measured the jitter
    of single steps (+-80-97 % over 9 pairs, 2026-11-30), not the runs."""
    import statistics

    from labkit.analysis.claims import Sample

    a, b = top.timeline.step_times_s()[1:], bottom.timeline.step_times_s()[1:]
    if not a or not b:
        raise ValueError("the runs have no steps after the first to compare")
    if min(len(a), len(b)) < 2:
        return Sample.of([statistics.median(a) / statistics.median(b)])
    qa, qb = (statistics.quantiles(xs, n=4, method="inclusive") for xs in (a, b))
    return Sample.of([x / y for x, y in zip(qa, qb)], "median")


def launchers_verdict(ours: Any, via_ray: Any) -> Any:
    """Whether a step cost about the same under both launchers (within 1.5x), judged on
    ``step_ratio`` (``labkit.analysis.claims.judge``); None without steps to compare."""
    from labkit.analysis.claims import Claim, judge

    try:
        sample = step_ratio(via_ray, ours)
    except ValueError:
        return None
    return judge(sample, Claim.within_factor(1.0, 1.5, "the same ranks on the same gloo cost "
                                             "about the same per step under either launcher"),
                 "Ray Train's step / labkit's, quartile by quartile", fmt=".2f")


def launchers_text(ours: Any, via_ray: Any) -> str:
    """Both launchers' times, how much of each run came before its first step, and whether a
    step cost the same under both (``launchers_verdict``); where it did not hold, the same
    ratio on both runs replayed on dedicated cores (``labkit.lessons.replayed``)."""
    from labkit.lessons.replayed import again

    out = []
    for name, r in (("labkit", ours), ("Ray Train", via_ray)):
        steps = r.config.steps
        before = max(0.0, r.wall_s - steps * r.step_time_s)
        out.append(f"{name:<10} whole run {r.wall_s:6.1f} s, {steps} steps of "
                   f"{r.step_time_s * 1e3:.0f} ms, so about {before:.1f} s before and around "
                   f"the steps (start-up, process group, end of run)")
    ratio = via_ray.wall_s / max(ours.wall_s, 1e-9)
    out.append(f"Ray Train took {ratio:.0f}x labkit's time for the same steps and the same "
               f"weights ({'same' if ours.params_sha256 == via_ray.params_sha256 else 'DIFFERENT'}"
               f" sha256)")
    v = launchers_verdict(ours, via_ray)
    if v is not None:
        out.append(v.sentence())
        if not v.holds:
            out.append(f"Ray's own processes (its raylet, its object store and the train "
                       f"controller, and the actors Ray Train starts beside its workers) stay "
                       f"alive beside the ranks and take turns on the same cores, and a step of "
                       f"{ours.step_time_s * 1e3:.0f} ms feels every such turn")
            out.append(again("Ray Train's step / labkit's", lambda a, b: step_ratio(a, b).value,
                             [via_ray, ours], v.sample.value))
            mine, theirs = compute_cpu_ms(ours), compute_cpu_ms(via_ray)
            if theirs > 1.5 * mine:  # not only waiting: the same spans used more CPU
                out.append(f"not only turns: Ray Train's ranks spent {theirs:.1f} ms of CPU a "
                           f"step in their compute spans against labkit's {mine:.1f} ms, so the "
                           f"replay, which keeps each span's CPU time, keeps that difference too")
    return "\n".join(out)


def compute_cpu_ms(run: Any) -> float:
    """CPU milliseconds a rank spent in compute spans per step (steps after the first, mean
    over ranks): what a step cost its cores, without the waits."""
    from labkit.base.events import Lane

    tl = run.timeline.window()
    cpu_ns = sum(e.cpu_ns for e in tl.events if e.lane is Lane.COMPUTE and e.cpu_ns is not None)
    return cpu_ns / 1e6 / max(len(tl.ranks), 1) / max(len(tl.steps()), 1)


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` (psutil reads the process table)."""
    import psutil

    try:
        return {p.pid for p in psutil.Process(root).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def stop_ray() -> list[tuple[int, str]]:
    """Stop this kernel's Ray and return the Ray processes *it* started that are still
    alive (other programs on the machine may run Ray sessions of their own: they are not
    this lesson's)."""
    import psutil

    from labkit.launchers.ray import ray_processes, shutdown_ray

    mine = _descendants(os.getpid())
    ours = [(pid, name) for pid, name in ray_processes() if pid in mine]
    shutdown_ray()
    return [(pid, name) for pid, name in ours if psutil.pid_exists(pid)]
