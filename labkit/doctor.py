"""``labkit doctor``: what this machine can run, in one look.

Reports Python and torch versions, which distributed backends torch was built with, CPU
cores and GPUs, the world sizes that make sense here, whether JupyterLab and nbgrader
are installed, and whether emulated nodes (``labkit.launchers.cluster``: network namespaces joined
by a shaped link) can run here and why not — the first thing to run on a new laptop or
GPU server. ``labkit doctor --clean`` also removes what dead runs left behind: the processes
and run directories of runs whose owner died (``labkit.launchers.rundirs``), and the
namespaces, links and agents of crashed cluster runs.
What the machine *has* is this report; whether each lesson *shows its point* here is
``labkit doctor --selftest`` (``labkit.selftest``), the next thing to run.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import types
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from labkit.base import devices
from labkit.launchers import forkserver

SLOW_IMPORT_NOTE = (
    "rfc3987-syntax is installed (jupyter-events brings it, through jsonschema's format-nongpl "
    "extra): it builds about 35 parsers whenever jsonschema is imported, 2.7 s of CPU on a "
    "2-core laptop, in every one of Ray's processes (a Ray run starts about ten), each nbgrader "
    "command and each Jupyter server. Nothing in Jupyter, Ray or nbgrader checks IRIs with it: "
    "`pip uninstall rfc3987-syntax` (`make lab` does) took a 2-step Ray run on such a laptop "
    "from 82 s to 43 s")
"""Said when ``rfc3987_syntax`` can be imported (docs/benchmarks.md, "Ray's start")."""


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class DoctorReport:
    python: str
    platform: str
    torch: str | None
    backends: dict[str, bool]
    cpu_cores: int
    gpus: list[dict[str, Any]]
    suggested_world_sizes: list[int]
    packages: dict[str, str | None]
    strategies: list[str]
    notes: list[str] = field(default_factory=list)
    cluster: dict[str, Any] = field(default_factory=dict)
    """Emulated nodes: available, mode, reason, tbf / netem, leftovers of dead runs."""
    rank_start: str = "forked"
    """How ranks start: ``forked`` from the warm fork server, or ``exec`` (switched off)."""
    runs_cleaned: dict[str, list[Any]] | None = None
    """With ``--clean``: processes killed and run directories removed, of dead runs."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __str__(self) -> str:
        ok = lambda b: "yes" if b else "no"
        lines = [f"labkit doctor — {self.platform}",
                 f"  Python          {self.python}",
                 f"  torch           {self.torch or 'NOT INSTALLED'}",
                 "  backends        " + ", ".join(f"{k}: {ok(v)}" for k, v in
                                                  self.backends.items()),
                 f"  CPU cores       {self.cpu_cores}",
                 f"  GPUs            {len(self.gpus) or 'none'}"]
        for g in self.gpus:
            lines.append(f"    cuda:{g['index']}  {g['name']}  {g['memory_gb']:.1f} GB")
        lines.append("  world sizes     " + ", ".join(map(str, self.suggested_world_sizes))
                     + "  (timings are fair up to one rank per core)")
        for name, ver in self.packages.items():
            lines.append(f"  {name:<15} {ver or 'not installed'}")
        lines.append("  strategies      " + ", ".join(self.strategies))
        lines.append("  ranks start     " + (
            "forked from a warm fork server (torch imported once; LABKIT_FORKSERVER=0 execs "
            "each rank)" if self.rank_start == "forked" else
            "exec'd, each importing torch (LABKIT_FORKSERVER=0; unset it to fork them)"))
        lines += _cluster_lines(self.cluster)
        if self.runs_cleaned is not None:
            lines.append(f"  dead runs       {len(self.runs_cleaned['processes'])} process(es) "
                         f"killed, {len(self.runs_cleaned['run_dirs'])} run dir(s) removed")
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("  next            `labkit doctor --selftest`: each lesson's point, checked "
                     "on this machine")
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))


def _cluster_lines(c: dict[str, Any]) -> list[str]:
    if not c:
        return []
    if not c["available"]:
        return [f"  emulated nodes  no: {c['reason']}",
                "                  (lesson 10 then shows the alpha-beta predictions only)"]
    shaping = c["shaping"]
    ways = ", ".join(f"{name}: {'yes' if c.get(key) else 'no'}" for name, key in
                     (("as root", "root_namespaces"), ("user namespaces", "user_namespaces")))
    lines = [f"  emulated nodes  yes ({c['mode']}): {c['reason']}",
             f"                  ({ways})",
             f"  link shaping    rate (tbf): {'yes' if shaping['tbf'] else 'NO'}, latency "
             f"(netem): {'yes' if shaping['netem'] else 'no, links keep the machine latency'}"]
    left = c.get("leftovers", {})
    if left.get("namespaces") or left.get("processes"):
        lines.append(f"  leftovers       {len(left['namespaces'])} namespace(s), "
                     f"{len(left['processes'])} process(es) of dead cluster runs: "
                     f"`labkit doctor --clean` removes them")
    if c.get("cleaned"):
        lines.append(f"  cleaned         {c['cleaned']}")
    return lines


def cluster_status(clean: bool = False) -> dict[str, Any]:
    """Emulated nodes on this machine: can they run, how, and what dead runs left behind."""
    from labkit.base.netsupport import link_shaping, support
    from labkit.launchers.cluster import leftovers, netns

    where = support()
    out: dict[str, Any] = {"available": where.available, "mode": where.mode,
                           "reason": where.reason}
    if where.available or os.environ.get("LABKIT_CLUSTER_MODE", "") != "off":
        from labkit.base.netsupport import root_works, userns_works

        # both ways, so an instructor sees what a non-root student would get
        out["root_namespaces"] = os.geteuid() == 0 and root_works()[0]
        out["user_namespaces"] = userns_works()[0]
    if clean:
        out["cleaned"] = str(leftovers.sweep())
    if where.available:
        out["shaping"] = link_shaping()
        dead = [(pid, rid) for pid, rid, lock in leftovers.run_processes()
                if not leftovers.is_alive(Path(lock) if lock else leftovers.lock_path(rid))]
        spaces = [ns for ns in (netns.labkit_namespaces() if where.mode == "root" else [])
                  if not leftovers.is_alive(leftovers.lock_path(ns.split("-")[1]))]
        out["leftovers"] = {"namespaces": spaces, "processes": [pid for pid, _ in dead]}
    return out


def doctor(clean: bool = False) -> DoctorReport:
    from labkit.config import registry
    from labkit.launchers import rundirs

    runs_cleaned = rundirs.clean() if clean else None
    notes: list[str] = []
    torch_version = _version("torch")
    backends = {"gloo": False, "nccl": False, "mpi": False}
    gpus: list[dict[str, Any]] = []
    if torch_version:
        import torch
        import torch.distributed as dist

        backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                    "mpi": dist.is_mpi_available()}
        for i in range(devices.gpu_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": props.name, "memory_gb": props.total_memory / 1e9})
    else:
        notes.append("torch is missing: run `make lab` or `pip install torch==2.13.0`")
    if importlib.util.find_spec("rfc3987_syntax") is not None:
        notes.append(SLOW_IMPORT_NOTE)
    cores = devices.cpu_count()
    if gpus:
        sizes = [n for n in (1, 2, 4, 8) if n <= len(gpus)]
        notes.append(f"backend='auto' will use NCCL for world sizes up to {len(gpus)}")
    else:
        sizes = [n for n in (1, 2, 4) if n <= max(cores, 2)] or [1]
        if cores < 4:
            notes.append(f"{cores} cores: 4-rank runs are correct but oversubscribed "
                         "(their timings include waiting for a core)")
    return DoctorReport(
        python=sys.version.split()[0], platform=platform.platform(), torch=torch_version,
        backends=backends, cpu_cores=cores, gpus=gpus, suggested_world_sizes=sizes,
        packages={p: _version(p) for p in ("jupyterlab", "ipywidgets", "nbgrader",
                                            "matplotlib")},
        strategies=registry.names(), notes=notes, cluster=cluster_status(clean),
        rank_start="forked" if forkserver.enabled() else "exec", runs_cleaned=runs_cleaned)


class _CallableModule(types.ModuleType):
    """``labkit.doctor`` names both this module and its function: importing the module (as
    ``labkit doctor`` does) replaces the package's attribute with the module, so the module
    itself answers ``labkit.doctor()`` and a notebook's call works whatever ran first."""

    def __call__(self, clean: bool = False) -> DoctorReport:
        return doctor(clean)


sys.modules[__name__].__class__ = _CallableModule
