"""Benchmark for lesson 10: a two-node cluster on one machine, every number beside its bar.

Prints, from real runs across emulated nodes (network namespaces joined by a tc-shaped link,
one torchrun agent per node):
  1. each link: shaped rate vs measured TCP goodput (bar: within 10%);
  2. `labkit run allreduce-bench --nodes 2 --link 200mbit --impl builtin --sizes 4MB`:
     busbw vs what the link carries (bar: no higher);
  3. DDP on 1 rank, 1 node x 2 ranks and 2 nodes over a fast and a slow link: step time vs
     the alpha-beta prediction (bar: within 20%), and the slow/fast ratio measured vs predicted;
     the same on 4 ranks (2 nodes x 2) with --world-size 4;
  4. TP vs pipeline inside one node and across the link (which placement wins, by how much);
  5. flat ring vs hierarchical all-reduce on 2 nodes x 2 ranks (measured vs predicted speedup);
  6. compression speedups on loopback vs on the slow link;
  7. the FAQ's overhead shares as measured; 8. labkit namespaces / processes left (bar: 0).
Needs root or unprivileged user namespaces. Run on a quiet machine:
``.venv/bin/python bench/bench_cluster.py [--fast infiniband_hdr] [--slow ethernet_25g]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from labkit.base.netsupport import support
from labkit.launchers.cluster import leftovers
from labkit.lessons import cluster as ex
from labkit.lessons import cluster_comm as cx


def check(ok: bool) -> str:
    return "OK" if ok else "OUTSIDE THE BAR"


def ddp_section(fast: str, slow: str, world_size: int, steps: int) -> dict:
    """3. DDP: rows, per-link prediction errors, slow / fast ratio."""
    if world_size == 2:
        d = ex.ddp_across_links((fast, slow), steps=steps)
    else:  # 2 nodes x 2 ranks: compare with the 1-node run of the same 4 ranks
        import labkit
        from labkit.lessons import cluster_predict as predict

        kw = dict(strategy="ddp", steps=steps, batch_size=256, model=ex.DDP_MODEL,
                  threads_per_rank=1, timeout_s=300, progress=False)
        loop = labkit.run(world_size=4, **kw)
        rows = [ex._ddp_row("1 node x 4 ranks", 1, None, loop, loop.step_time_s)]
        for link in (fast, slow):
            r = labkit.run(world_size=4, nodes=2, link=link, **kw)
            row = ex._ddp_row(f"2 nodes x 2 ranks, {link}", 2, link, r, loop.step_time_s)
            # the ring of 4 crosses each node's uplink once: 2(n-1)/n of the gradients
            comm = predict.allreduce_s(float(r.metrics["bytes_per_step"]), 4,
                                       predict.link_model(r.metrics["link"]))
            base = row["step_s"] - row["exposed_s"]
            row.update(predicted_comm_s=comm, predicted_step_s=base + comm,
                       error=row["step_s"] / (base + comm) - 1)
            rows.append(row)
        d = {"rows": rows}
    print(ex.table(d["rows"], ["name", "step_s", "compute_s", "exposed_s", "efficiency",
                               "predicted_comm_s", "predicted_step_s", "error"]))
    cross = [r for r in d["rows"] if r["nodes"] == 2]
    for r in cross:
        print(f"  {r['link']}: step vs prediction {r['error']:+.1%}  "
              f"{check(abs(r['error']) <= 0.2)} (bar: within 20%)")
    f, s = cross
    measured, predicted = s["step_s"] / f["step_s"], s["predicted_step_s"] / f["predicted_step_s"]
    print(f"  slow/fast step ratio: measured {measured:.2f}x, predicted {predicted:.2f}x "
          f"({measured / predicted - 1:+.1%}, {check(abs(measured / predicted - 1) <= 0.2)})")
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast", default="infiniband_hdr")
    ap.add_argument("--slow", default="ethernet_25g")
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    where = support()
    print(f"emulated nodes: {where.mode or 'NOT AVAILABLE'} ({where.reason})")
    if not where.available:
        sys.exit(1)
    t0 = time.monotonic()
    print("\n1. links: shaped rate vs measured goodput")
    rows = ex.measure_links(("infiniband_hdr", "ethernet_100g", "ethernet_25g", "ethernet_10g"))
    print(ex.table(rows, ["link", "rate_bps", "measured_bps", "rate_error", "latency_s",
                          "measured_latency_s"]))
    print(f"  worst rate error {max(abs(r['rate_error']) for r in rows):.1%} "
          f"{check(all(abs(r['rate_error']) <= 0.1 for r in rows))} (bar: within 10%)")

    print("\n2. labkit run allreduce-bench --nodes 2 --world-size 2 --link 200mbit --impl builtin "
          "--sizes 4MB --json")
    p = subprocess.run([sys.executable, "-m", "labkit.cli", "run", "allreduce-bench", "--nodes",
                        "2", "--world-size", "2", "--link", "200mbit", "--impl", "builtin",
                        "--sizes", "4MB", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(p.stdout)
    link, res = data["metrics"]["link"], data["metrics"]["results"][0]
    err = link["measured_bps"] / link["rate_bps"] - 1
    busbw = res["busbw_gbps"] * 1e9
    print(f"  rate {link['rate_bps'] / 1e6:g} Mbit/s, measured {link['measured_bps'] / 1e6:.1f} "
          f"Mbit/s ({err:+.1%}, {check(abs(err) <= 0.1)}); busbw {busbw / 1e6:.2f} MB/s vs link "
          f"{link['max_busbw_Bps'] / 1e6:.2f} MB/s ({check(busbw <= link['max_busbw_Bps'])})")

    print(f"\n3. DDP, 2 ranks: 1 node vs 2 nodes over {args.fast} and {args.slow}")
    ddp = ddp_section(args.fast, args.slow, 2, args.steps)
    print(f"\n3b. DDP, 4 ranks: 1 node vs 2 nodes x 2 over {args.fast} and {args.slow}")
    ddp_section(args.fast, args.slow, 4, args.steps)

    print("\n4. placement: TP vs pipeline, inside one node and across ethernet_100g")
    place = cx.placement("ethernet_100g", steps=8)
    print(ex.table(place["rows"], ["strategy", "where", "step_s", "predicted_step_s", "slowdown",
                                   "predicted_slowdown", "link_bytes_per_step"]))
    tp, pp = (next(r for r in place["rows"] if r["strategy"] == s and "across" in r["where"])
              for s in ("tp", "pipeline"))
    print(f"  across the link the pipeline step is {tp['step_s'] / pp['step_s']:.2f}x faster than "
          f"TP's (same model work); TP slows {tp['slowdown']:.2f}x, the pipeline "
          f"{pp['slowdown']:.2f}x")

    print("\n5. flat ring vs hierarchical all-reduce, 2 nodes x 2 ranks, ethernet_100g")
    hier = cx.hierarchical_vs_flat("ethernet_100g", sizes=("1MB", "4MB", "16MB"), iters=4)
    print(ex.table(hier["rows"], ["impl", "bytes", "time_s", "predicted_s", "busbw_gbps"]))
    big = [r for r in hier["rows"] if r["bytes"] == 16_000_000]
    flat, hi = (next(r for r in big if r["impl"] == i) for i in ("ring", "hierarchical"))
    print(f"  16 MB: hierarchical {flat['time_s'] / hi['time_s']:.2f}x faster "
          f"(predicted {flat['predicted_s'] / hi['predicted_s']:.2f}x)")

    print(f"\n6. compression on loopback vs {args.slow}")
    comp = cx.compression_on_link(args.slow, steps=10)
    print(ex.table(comp["rows"], ["method", "wire_bytes", "loopback_step_s", "link_step_s",
                                  "predicted_link_comm_s", "speedup_loopback", "speedup_link"]))

    print("\n7. seed 001's FAQ restated (exposed comm / step, DDP above)")
    ov = ex.overhead_inside_vs_across(ddp, args.fast)
    print(f"  inside one node {ov['inside']:.0%} (FAQ 5-15%), across {ov['link']} "
          f"{ov['across']:.0%} (FAQ 15-30%)")

    left = leftovers.sweep()
    print(f"\n8. left behind after every run: {left} ({check(not left)})")
    print(f"\n{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
