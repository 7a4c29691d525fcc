"""API requests per swept node, by kind, against the simulated cluster over HTTP.

    python -m benchmarks.requests_per_node [--nodes 100 1000] [--concurrency 100]

For each fleet size, with the default config and with `node_condition: true`, it sweeps every
node (runs of `concurrency` nodes until all are swept) and prints the requests the API server
answered per swept node, by verb and resource (LIST and WATCH apart from GET), the run-wide
ones (lock, switches, discovery, reconcile, the run's watches) included. Then it times an empty
`sweeper sweep` (no node due): its wall time, and what is left of it past its API calls.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from sweeper.config import Config
from sweeper.history import History
from sweeper.kube import Kube
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.server import ApiServer
from sweeper.sweep import Sweep

_PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/[^/]+(?=/))?/(?P<plural>[^/]+)"
                   r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$")


# What a run asks once however many nodes it sweeps: the lock, the switches, discovery (with DRA's
# ResourceSlices and ResourceClaims), reconcile, pending demand (with Kueue's Workloads), and the
# lists and watches that follow its Jobs. One node's ResourceSlices (a field selector) are its own.
SHARED = ("leases", "configmaps", "LIST nodes", "LIST jobs", "WATCH", "LIST pods (cluster)", "LIST events",
          "LIST resourceslices (cluster)", "LIST resourceclaims", "LIST workloads")


def kind(method: str, raw_path: str) -> str:
    url = urlparse(raw_path)
    m = _PATH.match(url.path)
    if not m:
        return f"{method} {url.path}"
    resource = m.group("plural") + (f"/{m.group('sub')}" if m.group("sub") else "")
    watching = parse_qs(url.query).get("watch", [""])[0].lower() in ("true", "1")
    verb = "WATCH" if watching else "LIST" if method == "GET" and not m.group("name") else method
    if verb == "LIST" and resource == "pods":
        fields = parse_qs(url.query).get("fieldSelector", [""])[0]
        resource += " (one node)" if "spec.nodeName=" in fields and "spec.nodeName=," not in fields + "," \
            else " (one Job)" if "job-name" in parse_qs(url.query).get("labelSelector", [""])[0] else " (cluster)"
    if verb == "LIST" and resource == "resourceslices":
        fields = parse_qs(url.query).get("fieldSelector", [""])[0]
        resource += " (one node)" if "spec.nodeName=" in fields else " (cluster)"
    return f"{verb} {resource}"


def shared(k: str) -> bool:
    return any(s in k for s in SHARED)


class CountingServer(ApiServer):
    """The simulated API server, keeping each request's query too (selectors tell a node's own
    pod list from the run's)."""

    def __init__(self, cluster: SimCluster) -> None:
        super().__init__(cluster)
        self.seen: list[tuple[str, str]] = []

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, object, str]:
        self.seen.append((method, raw_path))
        return super().handle(method, raw_path, headers, body)


def fleet(nodes: int, speed: float) -> SimCluster:
    return SimCluster(parse_fleet({"name": "requests", "seed": 5, "speed": speed, "check_seconds": 45,
                                   "node_groups": [{"name_prefix": "gpu-", "count": nodes,
                                                    "instance_type": "p5.48xlarge", "age": "2d"}]}))


def per_node(nodes: int, concurrency: int, condition: bool, speed: float) -> tuple[float, Counter[str], int]:
    cluster = fleet(nodes, speed)
    cfg = replace(Config(), max_nodes=concurrency, max_percent=100, node_condition=condition)
    with CountingServer(cluster) as server, tempfile.TemporaryDirectory() as tmp:
        kube = Kube.from_config(str(server.write_kubeconfig(Path(tmp) / "kc")), clock=cluster.clock)
        hist = History(Path(tmp) / "h.db")
        before = len(server.seen)
        swept = runs = 0
        while swept < nodes:
            report = Sweep(kube, cfg, hist, clock=cluster.clock).run()
            swept += sum(1 for o in report.outcomes if o.action in ("released", "held"))
            runs += 1
        counts = Counter(kind(m, p) for m, p in server.seen[before:])
        kube.close()
        hist.close()
    return sum(counts.values()) / swept, counts, runs


def empty_sweep(speed: float) -> tuple[float, float, int]:
    """Wall time of a run with nothing due, and the part of it spent outside its API calls."""
    cluster = fleet(10, speed)
    cfg = replace(Config(), max_nodes=10, max_percent=100)
    with ApiServer(cluster) as plain, tempfile.TemporaryDirectory() as tmp:
        kube = Kube.from_config(str(plain.write_kubeconfig(Path(tmp) / "kc")), clock=cluster.clock)
        hist = History(Path(tmp) / "h.db")
        Sweep(kube, cfg, hist, clock=cluster.clock).run()  # sweeps all 10: none is due after it
        in_calls = [0.0]
        call = kube._call

        def timed(*a: object, **kw: object) -> object:
            t0 = time.perf_counter()
            try:
                return call(*a, **kw)  # type: ignore[arg-type]
            finally:
                in_calls[0] += time.perf_counter() - t0
        kube._call = timed  # type: ignore[method-assign]
        t0 = time.perf_counter()
        report = Sweep(kube, cfg, hist, clock=cluster.clock).run()
        wall = time.perf_counter() - t0
        kube.close()
        hist.close()
    assert not report.outcomes, "nothing was due"
    return wall, wall - in_calls[0], report.api_requests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--concurrency", type=int, default=100)
    # Slow enough that a busy machine does not stretch the moment between a hold and the playbook's
    # first steps past SEEN_FRESH in simulated time (a faster clock charges the machine's own
    # slowness to the sweep as if time had passed on the cluster).
    ap.add_argument("--speed", type=float, default=10.0, help="simulated seconds per real second")
    args = ap.parse_args()
    for n in args.nodes:
        for condition in (False, True):
            total, counts, runs = per_node(n, min(args.concurrency, n), condition, args.speed)
            swept = n
            label = "node_condition" if condition else "default config"
            own = sum(c for k, c in counts.items() if not shared(k)) / swept
            print(f"{n} nodes, {label}: {total:.2f} API requests per swept node ({runs} runs): {own:.2f} the "
                  f"node's own, {total - own:.2f} its share of what each run asks once")
            for k, c in sorted(counts.items(), key=lambda kv: (shared(kv[0]), -kv[1], kv[0])):
                print(f"  {c / swept:6.2f}  {k}{'  (shared by the run)' if shared(k) else ''}")
    wall, outside, requests = empty_sweep(args.speed)
    print(f"empty sweep (no node due): {wall * 1000:.0f} ms wall, {outside * 1000:.0f} ms of it outside its "
          f"{requests} API calls")


if __name__ == "__main__":
    main()
