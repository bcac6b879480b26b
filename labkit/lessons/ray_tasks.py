"""Lesson 12's Ray experiments: tasks and futures, an actor holding state, the object store.

1. ``actor_parameter_server``: the parameter server of lesson 11 rebuilt from Ray's two
   primitives (the shape of Ray's own parameter-server example, docs.ray.io): the server is
   an *actor* (one process holding the weights across calls), each gradient is a stateless
   *task* Ray schedules on whichever worker process is free, returning a *future*. The
   driver keeps one task in flight per logical worker; ``sync=True`` waits for all of them
   and applies their mean (BSP), ``sync=False`` applies each gradient the moment its future
   resolves (``ray.wait``: ASP). Every call records its process id and start / end on the
   host's monotonic clock, so ``labkit.visuals.ray.plot_ray_calls`` shows what ran where.
   The weights go to the tasks by reference: ``ray.put`` once per version.
2. ``by_value_vs_by_reference``: the same payload handed to the same tasks two ways. By
   value, every ``f.remote(array)`` serializes the array into the object store again; by
   reference, ``ray.put`` stores it once and every task reads that one copy (numpy arrays are
   read zero-copy from shared memory). The payload is wrapped in ``Counted``, whose
   ``__reduce__`` counts in the driver every time Ray pickles it: the serializations are
   counted, not assumed.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit.config.run import ModelConfig
from labkit.launchers.ray.session import ensure_ray

LESSON_MODEL = ModelConfig(width=64, depth=2)


@dataclass
class Call:
    """One remote call as it ran: where (process id), what, and when (host monotonic ns)."""

    pid: int
    what: str
    worker: int | None
    start_ns: int
    end_ns: int


@dataclass
class ActorRun:
    """What ``actor_parameter_server`` measured."""

    sync: bool
    losses: list[float]
    """Per applied gradient (ASP) or round (BSP): the training loss it was computed on."""
    staleness: list[int]
    """Per gradient: server version when applied minus the version it was computed on."""
    calls: list[Call] = field(default_factory=list)
    wall_s: float = 0.0
    actor_pid: int = 0


class ServerActor:
    """Ray actor: the weights, a version counter and the optimizer step (plain SGD)."""

    def __init__(self, model: ModelConfig, seed: int, lr: float, workers: int):
        import torch

        from labkit.train.models import build_mlp

        self.net = build_mlp(model, seed)
        self.flat = torch.nn.utils.parameters_to_vector(self.net.parameters()).detach()
        self.lr, self.workers, self.version = lr, workers, 0

    def pull(self) -> tuple[int, np.ndarray, Call]:
        t0 = time.monotonic_ns()
        weights = self.flat.numpy().copy()
        return self.version, weights, Call(os.getpid(), "pull", None, t0, time.monotonic_ns())

    def push(self, grads: list[np.ndarray], read_version: int) -> tuple[int, Call]:
        """Apply ``grads`` (one for ASP, every worker's for BSP), each with weight 1/workers:
        BSP applies their mean, ASP each one a workers-th of a step (as in lesson 11)."""
        import torch

        t0 = time.monotonic_ns()
        self.flat -= self.lr * torch.from_numpy(np.sum(grads, axis=0)) / self.workers
        staleness = self.version - read_version
        self.version += 1
        return staleness, Call(os.getpid(), "apply", None, t0, time.monotonic_ns())


def gradient_task(weights: np.ndarray, version: int, worker: int, step: int, workers: int,
                  model: ModelConfig, seed: int, batch: int, slow_s: float
                  ) -> tuple[np.ndarray, float, int, Call]:
    """Ray task: one worker's gradient on its shard of step ``step``'s batch."""
    import torch

    from labkit.train.data import SyntheticTask
    from labkit.train.models import build_mlp

    t0 = time.monotonic_ns()
    torch.set_num_threads(1)
    net = build_mlp(model, seed)
    torch.nn.utils.vector_to_parameters(torch.from_numpy(weights.copy()), net.parameters())
    x, y = SyntheticTask(seed, model.in_dim, model.out_dim).batch(step, batch * workers,
                                                                    worker, workers)
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    grad = torch.cat([p.grad.reshape(-1) for p in net.parameters() if p.grad is not None])
    if slow_s:
        time.sleep(slow_s)
    call = Call(os.getpid(), f"grad w{worker}", worker, t0, time.monotonic_ns())
    return grad.numpy(), float(loss), version, call


def actor_parameter_server(*, sync: bool, workers: int = 3, steps: int = 8, lr: float = 0.3,
                           batch: int = 32, straggler: int | None = None, slow_s: float = 0.05,
                           model: ModelConfig = LESSON_MODEL, seed: int = 0) -> ActorRun:
    """Train with a Ray actor as server and Ray tasks as workers (module docstring, 1)."""
    ray = ensure_ray()
    server = ray.remote(num_cpus=0)(ServerActor).remote(model, seed, lr, workers)
    task = ray.remote(num_cpus=1)(gradient_task)
    run = ActorRun(sync=sync, losses=[], staleness=[])
    t0 = time.monotonic()

    def launch(worker: int, step: int) -> Any:
        version, weights, call = ray.get(server.pull.remote())
        run.calls.append(call)
        ref = ray.put(weights)  # by reference: one copy in the object store per version
        return task.remote(ref, version, worker, step, workers, model, seed, batch,
                           slow_s if worker == straggler else 0.0)

    if sync:
        for step in range(steps):
            results = ray.get([launch(w, step) for w in range(workers)])
            grads = [g for g, *_ in results]
            staleness, call = ray.get(server.push.remote(grads, results[0][2]))
            run.calls += [c for *_, c in results] + [call]
            run.losses.append(statistics.fmean(loss for _, loss, _, _ in results))
            run.staleness += [staleness] * workers
    else:
        next_step = dict.fromkeys(range(workers), 1)
        pending = {launch(w, 0): w for w in range(workers)}
        while pending:
            [done], _ = ray.wait(list(pending), num_returns=1)
            worker = pending.pop(done)
            grad, loss, version, call = ray.get(done)
            staleness, applied = ray.get(server.push.remote([grad], version))
            run.calls += [call, applied]
            run.losses.append(loss)
            run.staleness.append(staleness)
            if next_step[worker] < steps:
                pending[launch(worker, next_step[worker])] = worker
                next_step[worker] += 1
    run.wall_s = time.monotonic() - t0
    run.actor_pid = run.calls[0].pid
    ray.kill(server)
    return run


def slow_square(x: float, delay_s: float = 0.2) -> dict[str, Any]:
    """A demo task: ``x * x`` after ``delay_s`` seconds, with the process that computed it and
    when it finished (``end_s``: ``time.monotonic()``, one clock for every process of the host,
    so the driver can time its tasks however long the student waits before collecting them)."""
    time.sleep(delay_s)
    return {"x": x, "square": x * x, "pid": os.getpid(), "end_s": time.monotonic()}


_SERIALIZED = [0]
"""How many times this process has pickled a ``Counted`` payload."""


def _unwrap(array: np.ndarray) -> np.ndarray:
    return array


class Counted:
    """A numpy payload that counts, in the process that pickles it (the driver), every time
    it is serialized; it arrives in a task as the plain array (zero-copy where Ray can)."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray]]:
        _SERIALIZED[0] += 1
        return _unwrap, (self.array,)


def _checksum(array: np.ndarray) -> float:
    """Ray task of the by-value / by-reference measurement: reads the payload lightly."""
    return float(array[:: 4096].sum())


def by_value_vs_by_reference(*, payload_mb: float = 20.0, tasks: int = 16,
                             repeats: int = 3) -> dict[str, Any]:
    """Time ``tasks`` tasks reading one ``payload_mb`` MB array, passed by value (serialized
    into the object store once per task) and by reference (``ray.put`` once). Each variant
    runs ``repeats`` times, alternating; the median time is reported, and the most times
    the driver serialized the payload in one repeat (``serialized_by_value`` /
    ``serialized_by_reference``, counted by ``Counted``)."""
    ray = ensure_ray()
    task = ray.remote(num_cpus=1)(_checksum)
    array = np.random.default_rng(0).random(int(payload_mb * 1e6 / 8))
    payload = Counted(array)
    ray.get([task.remote(np.zeros(8)) for _ in range(4)])  # start the worker processes first
    times: dict[str, list[float]] = {"by_value": [], "by_reference": []}
    counts: dict[str, list[int]] = {"by_value": [], "by_reference": []}
    for _ in range(repeats):
        before, t0 = _SERIALIZED[0], time.perf_counter()
        ray.get([task.remote(payload) for _ in range(tasks)])
        times["by_value"].append(time.perf_counter() - t0)
        counts["by_value"].append(_SERIALIZED[0] - before)
        before, t0 = _SERIALIZED[0], time.perf_counter()
        ref = ray.put(payload)
        ray.get([task.remote(ref) for _ in range(tasks)])
        times["by_reference"].append(time.perf_counter() - t0)
        counts["by_reference"].append(_SERIALIZED[0] - before)
        del ref
    by_value, by_ref = (statistics.median(times[k]) for k in ("by_value", "by_reference"))
    value_n, ref_n = (max(counts[k]) for k in ("by_value", "by_reference"))
    return {"payload_mb": array.nbytes / 1e6, "tasks": tasks, "repeats": repeats,
            "by_value_s": by_value, "by_reference_s": by_ref, "speedup": by_value / by_ref,
            "serialized_by_value": value_n, "serialized_by_reference": ref_n,
            "copies_by_value": value_n, "copies_by_reference": ref_n,
            "mb_serialized_by_value": value_n * array.nbytes / 1e6,
            "mb_serialized_by_reference": ref_n * array.nbytes / 1e6}
