"""Ray in the lab (lesson 12): Ray started the lab's way, Ray Train as a labkit launcher, and
the lesson's experiments with tasks, actors, the object store and Ray Tune.

* ``session``: ``ensure_ray`` / ``shutdown_ray`` (once per process, bounded, loopback only,
  shut down at exit) and ``ray_processes`` (what a test checks is gone afterwards);
* ``launcher``: ``labkit.run(..., launcher="ray")`` through Ray Train's ``TorchTrainer``;
* ``lessons``: a parameter server as a Ray actor with gradient tasks, and by value vs by
  reference through the object store, measured;
* ``tune``: Ray Tune sweeping lesson 02's learning-rate scaling;
* ``faults``: an actor that dies and is restarted by Ray.

Importing this package does not import Ray; every function imports it when called.
"""

from labkit.launchers.ray.session import ensure_ray, ray_processes, shutdown_ray

__all__ = ["ensure_ray", "ray_processes", "shutdown_ray"]
