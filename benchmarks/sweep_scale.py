"""A sweep at fleet scale against the simulated cluster over HTTP.

    python -m benchmarks.sweep_scale [--nodes 5000 --pods 50000 --makespan-nodes 100 1000 --concurrency 50 --speed 10]

Prints: API requests and wall time of one discovery pass; the CPU time of planning; the
memory a discovery pass keeps (what Sweeper holds of the nodes and pods it read, measured
with tracemalloc on Sweeper's and the client's own allocations); and the makespan of sweeping
N idle nodes at a concurrency of C, against the ideal N / C x check time, as a ratio.
"""

from __future__ import annotations

import argparse
import gc
import math
import multiprocessing
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.discovery import build
from sweeper.clock import ScaledClock
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


def _serve_sim(fleet: Any, clock: ScaledClock, kubeconfig: Path, ready: Any, done: Any, out: Any) -> None:
    """The simulated cluster in a process of its own (forked, so it shares the parent's clock: the
    same start and the same system-wide monotonic time), until `done`; then its request count and
    its own CPU time go back through `out`."""
    server = ApiServer(SimCluster(fleet, clock)).start()
    server.write_kubeconfig(kubeconfig)
    ready.set()
    done.wait()
    out.send((len(server.cluster.store.requests), time.process_time()))
    server.stop()


def makespan(n: int, concurrency: int, check_seconds: float, speed: float) -> dict[str, float]:
    """Sweep `n` idle nodes at `concurrency` and `check_seconds` a check, with the simulated cluster
    in its own process: its CPU is not Sweeper's, and no lock of this interpreter is shared with it.
    What remains in the figure is Sweeper's own: its refills, polls and history writes, in real
    time times the clock's speed."""
    fleet = parse_fleet({"name": "makespan", "speed": speed, "check_seconds": check_seconds,
                         "node_groups": [{"name_prefix": "gpu-", "count": n, "instance_type": "p5.48xlarge"}]})
    clock = ScaledClock(speed)
    cfg = Config(max_nodes=concurrency, max_percent=100, poll_interval=5, check_timeout=3 * check_seconds,
                 min_node_age=0, run_deadline=0, light_playbook="")
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    recv, send = ctx.Pipe(duplex=False)
    with tempfile.TemporaryDirectory() as tmp:
        kc = Path(tmp) / "kc"
        sim = ctx.Process(target=_serve_sim, args=(fleet, clock, kc, ready, done, send), daemon=True)
        sim.start()
        if not ready.wait(120):
            raise SystemExit("the simulated cluster did not start")
        kube = Kube.from_config(str(kc), clock=clock)
        hist = History(Path(tmp) / "h.db")
        start = clock.now()
        real, cpu = time.perf_counter(), time.process_time()
        runs = swept = 0
        held: dict[str, float] = {}  # node -> simulated seconds from its hold to its hand-back

        def emit(event: str, data: dict[str, Any]) -> None:
            if event == "hold":
                held[data["node"]] = clock.now()
            elif event == "done" and data["node"] in held:
                held[data["node"]] = clock.now() - held[data["node"]]

        while swept < n and runs < 10:
            report = Sweep(kube, replace(cfg), hist, clock=clock, emit=emit).run()
            swept += sum(1 for o in report.outcomes if o.action == "released")
            runs += 1
        took = clock.now() - start
        real, cpu = time.perf_counter() - real, time.process_time() - cpu
        requests = kube.requests
        kube.close()
        hist.close()
        done.set()
        sim_requests, sim_cpu = recv.recv()
        sim.join(30)
    ideal = math.ceil(n / concurrency) * check_seconds
    per_node = sum(held.values()) / max(1, len(held))
    print(f"makespan of {n} nodes at concurrency {concurrency} ({check_seconds:g} s checks, {runs} run(s), "
          f"{swept} swept): {took:.0f} s simulated against an ideal of {ideal:.0f} s: ratio {took / ideal:.3f}; "
          f"a node is held {per_node:.0f} s on average ({per_node / check_seconds:.3f} of its check), so the "
          f"queue itself keeps its slots {sum(held.values()) / (concurrency * took):.1%} busy; "
          f"{requests / n:.1f} API requests per node ({sim_requests} served); {real:.0f} s real at {speed:g}x; "
          f"CPU: Sweeper {cpu:.1f} s, the simulator {sim_cpu:.1f} s in its own process (not in the figure)")
    return {"nodes": n, "ratio": took / ideal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=50000)
    ap.add_argument("--makespan-nodes", type=int, nargs="+", default=[1000],
                    help="one or more fleet sizes; each is swept and its ratio printed")
    ap.add_argument("--skip-discovery", action="store_true", help="only the makespan")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--check-seconds", type=float, default=600.0)
    ap.add_argument("--speed", type=float, default=10.0,
                    help="the simulated clock against real time: each real second Sweeper spends counts this many")
    args = ap.parse_args()
    print("$ python -m benchmarks.sweep_scale " + " ".join(sys.argv[1:]))
    if not args.skip_discovery:
        discovery(args.nodes, args.pods)
    ratios = [makespan(n, args.concurrency, args.check_seconds, args.speed) for n in args.makespan_nodes]
    print("ratio to the ideal by size: " + ", ".join(f"{r['nodes']:g} nodes {r['ratio']:.3f}" for r in ratios))


if __name__ == "__main__":
    main()
