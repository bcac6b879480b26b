"""Fault tolerance the Ray way (lesson 12): Ray restarts what died; your state is your job.

Ray's answers to a dead process (docs.ray.io, "Fault Tolerance"): a *task* whose worker
process dies is run again (``max_retries``); an *actor* whose process dies is started again
(``max_restarts``), by calling its constructor again, so whatever it held in memory is gone
unless it saved it; calls that were in flight fail unless ``max_task_retries`` allows a
retry (not for the call that kills it: the retry would kill the new process too).

``restart_demo`` shows both, for real: a parameter-server-like actor that checkpoints its
state every ``checkpoint_every`` updates to a file, is killed mid-run (``os._exit``) and comes
back in a new process from its last checkpoint; and a task that kills its own process on the
first attempt and succeeds on the retry. labkit's own answer (lesson 07) is the mirror
image: the supervisor stops the whole run on the first failure, and a resumed run restarts
every rank from the last complete sharded checkpoint, bit-identically.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from labkit.launchers.ray.session import ensure_ray


class CheckpointedCounter:
    """Ray actor: a version counter standing for a server's weights, saved every K updates."""

    def __init__(self, path: str, checkpoint_every: int):
        self.path, self.every = Path(path), checkpoint_every
        saved = json.loads(self.path.read_text()) if self.path.exists() else {"version": 0}
        self.version = self.restored = int(saved["version"])

    def update(self) -> int:
        self.version += 1
        if self.version % self.every == 0:
            self.path.write_text(json.dumps({"version": self.version}))
        return self.version

    def state(self) -> dict[str, int]:
        return {"pid": os.getpid(), "version": self.version, "restored_from": self.restored}

    def crash(self) -> None:
        os._exit(1)  # the process dies, as with a lost node or an out-of-memory kill


def flaky_task(marker: str) -> dict[str, Any]:
    """Ray task: kills its process the first time (no marker file yet), succeeds the second."""
    path = Path(marker)
    if not path.exists():
        path.write_text(str(os.getpid()))
        os._exit(1)
    return {"first_pid": int(path.read_text()), "retry_pid": os.getpid()}


def _when_back(ray: Any, actor: Any, limit_s: float = 120.0) -> dict[str, int]:
    """The actor's state once Ray has restarted it (calls fail while it is restarting)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            return dict(ray.get(actor.state.remote()))
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def restart_demo(*, updates: int = 7, checkpoint_every: int = 3) -> dict[str, Any]:
    """Kill an actor after ``updates`` updates and a task on its first try; both come back."""
    ray = ensure_ray()
    with tempfile.TemporaryDirectory(prefix="lab12-faults-") as tmp:
        actor = ray.remote(num_cpus=0, max_restarts=1)(
            CheckpointedCounter).remote(f"{tmp}/state.json", checkpoint_every)
        for _ in range(updates):
            ray.get(actor.update.remote())
        before = ray.get(actor.state.remote())
        try:
            ray.get(actor.crash.remote())
        except ray.exceptions.RayActorError:
            pass  # the call that killed the process fails; Ray restarts the actor
        after = _when_back(ray, actor)  # answered by the new process
        ray.kill(actor)
        task = ray.remote(num_cpus=1, max_retries=2)(flaky_task)
        retried = ray.get(task.remote(f"{tmp}/marker"))
    return {"actor_before": before, "actor_after": after,
            "updates_lost": before["version"] - after["version"],
            "task_first_pid": retried["first_pid"], "task_retry_pid": retried["retry_pid"]}
