"""A real multi-node cluster on one machine (lesson 10): namespaces, a shaped link, torchrun.

``labkit.run(strategy="ddp", world_size=4, nodes=2, link="infiniband_hdr")`` puts each node
in its own Linux network namespace, joins the nodes through a bridge with veth cables shaped
by ``tc`` (``netns``), measures the link (``probe``), and starts one ``torchrun`` agent per
node that meet through a c10d rendezvous across the link (``host``): the multi-node path an
instructor uses on real machines, with ``labkit.worker`` as the script. Ranks on one node
talk over its loopback, ranks on different nodes over the shaped wire, and the result is
the usual ``RunResult``: every rank of every node on one timeline, plus ``metrics["link"]``.

Modules: ``links`` (presets and specs, torch-free), ``support`` (root / user namespaces /
why not), ``netns`` (build and delete the network), ``leftovers`` (run ids, locks, the
sweep), ``probe`` (bandwidth and latency), ``host`` (inside the sandbox), ``session`` (the
launcher's side of one start), ``launcher`` (``run_cluster``, ``run_many``,
``measure_link``), ``failures`` (which rank broke a run), ``predict``, ``experiments`` and
``comm_experiments`` (lesson 10's measurements beside their predictions).
"""

from __future__ import annotations

from labkit.base.netsupport import Support, support
from labkit.config.links import PRESETS, SCALE, LinkSpec, parse_link

__all__ = ["PRESETS", "SCALE", "LinkSpec", "Support", "parse_link", "support"]
