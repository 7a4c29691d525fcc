"""How many API requests and how long one discovery pass takes, as the fleet grows.

    python -m benchmarks.discovery [--nodes 2000 --pods 20000]

One discovery pass is one paged LIST of GPU nodes and one paged LIST of unfinished pods,
against the simulated API server over HTTP with the official client. Requests must grow
only with the number of pages, never one per node.
"""

from __future__ import annotations

import argparse
import gc
import math
import tempfile
import time
from pathlib import Path

from sweeper.clock import iso
from sweeper.config import Config
from sweeper.fleet import plan
from sweeper.kube import Kube
from sweeper.sim.cluster import GPU, SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.server import ApiServer

DAEMONSETS = ["nvidia-device-plugin", "dcgm-exporter", "kube-proxy", "aws-node", "efa-device-plugin", "node-exporter"]


def build(nodes: int, pods: int) -> SimCluster:
    fleet = parse_fleet({"name": "bench", "speed": 1, "node_groups": [
        {"name_prefix": "gpu-", "count": nodes, "instance_type": "p5.48xlarge", "age": "30d"}]})
    cluster = SimCluster(fleet)
    store = cluster.store
    store.create("namespaces", None, {"metadata": {"name": "kube-node-ds"}})
    now = iso(cluster.clock.now())
    made = 0
    per_node = max(1, pods // nodes)
    for i in range(nodes):
        node = f"gpu-{i:0{len(str(nodes))}d}"
        for j in range(per_node):
            if made >= pods:
                break
            ds = j < len(DAEMONSETS)
            name = f"{DAEMONSETS[j]}-{i}" if ds else f"train-{i}-{j}"
            owner = [{"kind": "DaemonSet", "name": DAEMONSETS[j], "apiVersion": "apps/v1", "uid": str(j)}] if ds else []
            gpus = {} if ds else {GPU: "1"}
            store.create("pods", "kube-node-ds" if ds else "training", {
                "metadata": {"name": name, "ownerReferences": owner, "labels": {"app": "x"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "resources": {"limits": gpus}}]},
                "status": {"phase": "Running", "startTime": now}})
            made += 1
    return cluster


def measure(nodes: int, pods: int, page: int) -> dict[str, float]:
    cluster = build(nodes, pods)
    # The simulated cluster's own objects live in this process; keep them out of the collector's
    # scans so that what is timed is the discovery pass, not the garbage collector walking the fleet.
    gc.collect()
    gc.freeze()
    with ApiServer(cluster).start(controllers=False) as server, tempfile.TemporaryDirectory() as tmp:
        kc = server.write_kubeconfig(Path(tmp) / "kc")
        kube = Kube.from_config(str(kc))
        cfg = Config(page_size=page)
        t0 = time.perf_counter()
        node_objs = kube.list_nodes(cfg.gpu_node_selector, page_size=page)
        pod_objs = kube.active_pods(page_size=page)
        t1 = time.perf_counter()
        p = plan(node_objs, pod_objs, cfg, {}, cluster.clock.now())
        t2 = time.perf_counter()
        kube.close()
    gc.unfreeze()
    return {"nodes": len(node_objs), "pods": len(pod_objs), "requests": kube.requests,
            "expected": math.ceil(nodes / page) + math.ceil(pods / page), "list_s": t1 - t0, "plan_s": t2 - t1,
            "busy": sum(1 for d in p.skip if d.reason == "busy")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--pods", type=int, default=20000)
    ap.add_argument("--page", type=int, default=500)
    args = ap.parse_args()
    print(f"{'nodes':>6} {'pods':>7} {'requests':>9} {'pages':>6} {'list s':>7} {'plan s':>7} {'req/node':>9}")
    rows = []
    for frac in (0.25, 0.5, 1.0):
        n, p = int(args.nodes * frac), int(args.pods * frac)
        r = measure(n, p, args.page)
        rows.append(r)
        print(f"{r['nodes']:>6} {r['pods']:>7} {r['requests']:>9} {r['expected']:>6} {r['list_s']:>7.2f} "
              f"{r['plan_s']:>7.3f} {r['requests'] / r['nodes']:>9.4f}")
        assert r["requests"] == r["expected"], "discovery made requests beyond paging"
    small, big = rows[0], rows[-1]
    print(f"\nfleet x{big['nodes'] / small['nodes']:.0f}: requests x{big['requests'] / small['requests']:.2f} "
          f"(pages only), list time x{big['list_s'] / small['list_s']:.2f}")


if __name__ == "__main__":
    main()
