"""A sweep at fleet scale against the simulated cluster over HTTP.

    python -m benchmarks.sweep_scale [--nodes 5000 --pods 50000 --makespan-nodes 1000 --concurrency 50]

Prints: API requests and wall time of one discovery pass; the CPU time of planning; the
memory a discovery pass keeps (what Sweeper holds of the nodes and pods it read, measured
with tracemalloc on Sweeper's and the client's own allocations); and the makespan of sweeping
N idle nodes at a concurrency of C, against the ideal N / C x check time, as a ratio.
"""

from __future__ import annotations

import argparse
import gc
import math
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

from benchmarks.discovery import build
from sweeper.config import Config
from sweeper.fleet import plan
from sweeper.history import History
from sweeper.kube import Kube
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.server import ApiServer
from sweeper.sweep import Sweep


def discovery(nodes: int, pods: int) -> None:
    cluster = build(nodes, pods)
    gc.collect()
    gc.freeze()
    with ApiServer(cluster).start(controllers=False) as server, tempfile.TemporaryDirectory() as tmp:
        kube = Kube.from_config(str(server.write_kubeconfig(Path(tmp) / "kc")))
        cfg = Config()
        t0 = time.perf_counter()
        kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size)
        kube.active_pods(page_size=cfg.page_size)
        wall = time.perf_counter() - t0
        requests = kube.requests
        tracemalloc.start()  # a second pass, traced, for the memory figure (tracing slows it down)
        node_objs = kube.list_nodes(cfg.gpu_node_selector, page_size=cfg.page_size)
        pod_objs = kube.active_pods(page_size=cfg.page_size)
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, "*/sweeper/sim/*"),
                                                          tracemalloc.Filter(False, "*/http/server.py"),
                                                          tracemalloc.Filter(False, "*/socketserver.py")])
        tracemalloc.stop()
        kept = sum(s.size for s in snap.statistics("filename"))
        c0 = time.process_time()
        p = plan(node_objs, pod_objs, cfg, {}, cluster.clock.now())
        cpu = time.process_time() - c0
        kube.close()
    gc.unfreeze()
    print(f"discovery of {len(node_objs)} nodes and {len(pod_objs)} pods: {requests} API requests "
          f"(pages: {math.ceil(nodes / 500)} + {math.ceil(pods / 500)}), {wall:.2f} s")
    print(f"planning: {cpu * 1000:.0f} ms CPU ({len(p.take)} to take, {len(p.skip)} skipped)")
    print(f"memory kept by the discovery pass: {kept / 2**20:.1f} MiB ({kept / len(pod_objs):.0f} B per pod)")


def makespan(n: int, concurrency: int, check_seconds: float, speed: float) -> None:
    fleet = parse_fleet({"name": "makespan", "speed": speed, "check_seconds": check_seconds,
                         "node_groups": [{"name_prefix": "gpu-", "count": n, "instance_type": "p5.48xlarge"}]})
    cluster = SimCluster(fleet)
    cfg = Config(max_nodes=concurrency, max_percent=100, poll_interval=5, check_timeout=3 * check_seconds,
                 min_node_age=0)
    with ApiServer(cluster) as server, tempfile.TemporaryDirectory() as tmp:
        kube = Kube.from_config(str(server.write_kubeconfig(Path(tmp) / "kc")), clock=cluster.clock)
        hist = History(Path(tmp) / "h.db")
        start = cluster.clock.now()
        real = time.perf_counter()
        runs = swept = 0
        while swept < n:
            report = Sweep(kube, replace(cfg), hist, clock=cluster.clock).run()
            swept += sum(1 for o in report.outcomes if o.action == "released")
            runs += 1
        took = cluster.clock.now() - start
        real = time.perf_counter() - real
        requests = kube.requests
        kube.close()
        hist.close()
    ideal = n / concurrency * check_seconds
    print(f"makespan of {n} nodes at concurrency {concurrency} ({check_seconds:g} s checks, {runs} runs): "
          f"{took:.0f} s simulated against an ideal of {ideal:.0f} s: ratio {took / ideal:.2f}; "
          f"{requests / n:.1f} API requests per node; {real:.0f} s real at {speed:g}x (the in-process simulator "
          "serves every request, so a faster clock charges its own request time to the makespan)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=50000)
    ap.add_argument("--makespan-nodes", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--check-seconds", type=float, default=600.0)
    ap.add_argument("--speed", type=float, default=600.0)
    args = ap.parse_args()
    discovery(args.nodes, args.pods)
    makespan(args.makespan_nodes, args.concurrency, args.check_seconds, args.speed)


if __name__ == "__main__":
    main()
