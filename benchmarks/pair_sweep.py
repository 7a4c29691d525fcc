"""Pair sweeps on a simulated fleet: how many pair runs one rolling pass takes to find the
degraded links, and that no healthy node is held.

    python -m benchmarks.pair_sweep [--nodes 32] [--degraded 2] [--factor 0.4] [--seeds 20] [--max-nodes 8]

Per seed: a fleet of p5.48xlarge nodes of one placement, `--degraded` of them (placed at random
by the seed) with `link_degraded: FACTOR` (that share of the fabric rate left); one rolling run
of `pair-fabric.yaml` with re-pairing. It prints the pair runs used against the bound
ceil(N/2) + 2 x degraded (each failed pair costs two re-pairs), the culprits named, and the
healthy nodes held (which must be 0); then a summary over the seeds.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from sweeper.config import Config
from sweeper.history import History
from sweeper.kube import Kube
from sweeper.policy import HOLDING
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.server import ApiServer
from sweeper.sweep import Sweep


@dataclass
class Outcome:
    seed: int
    degraded: list[str]
    pair_runs: int
    repairs: int
    bound: int
    culprits: list[str]
    healthy_held: list[str]
    missed: list[str]
    seconds: float


def one(seed: int, nodes: int, degraded: int, factor: float, max_nodes: int, speed: float) -> Outcome:
    rng = random.Random(seed)
    names = [f"gpu-{i:02d}" for i in range(nodes)]
    bad = sorted(rng.sample(names, degraded))
    cluster = SimCluster(parse_fleet({
        "name": "pairs", "seed": seed, "speed": speed,
        "node_groups": [{"name_prefix": "gpu-", "count": nodes, "instance_type": "p5.48xlarge", "age": "2d"}],
        "faults": {n: {"link_degraded": factor} for n in bad}}))
    cfg = replace(Config(), playbook="pair-fabric.yaml", light_playbook="", max_nodes=max_nodes, max_percent=100,
                  run_deadline=0)
    t0 = time.perf_counter()
    with ApiServer(cluster) as server, tempfile.TemporaryDirectory() as tmp:
        kube = Kube.from_config(str(server.write_kubeconfig(Path(tmp) / "kc")), clock=cluster.clock)
        hist = History(Path(tmp) / "h.db")
        report = Sweep(kube, cfg, hist, clock=cluster.clock).run()
        rows = list(hist.db.query("select mode from pairs where run_id = ?", [report.run_id]))
        kube.close()
        hist.close()
    held = sorted({o.node for o in report.outcomes if o.action == "held" and o.verdict in HOLDING})
    return Outcome(seed, bad, len(rows), sum(1 for r in rows if r["mode"] == "repair"),
                   math.ceil(nodes / 2) + 2 * degraded, [n for n in held if n in bad],
                   [n for n in held if n not in bad], [n for n in bad if n not in held], time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--degraded", type=int, default=2)
    ap.add_argument("--factor", type=float, default=0.4, help="share of the fabric rate a degraded node keeps")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--max-nodes", type=int, default=8, help="nodes under test at once (a pair counts two)")
    ap.add_argument("--speed", type=float, default=600.0, help="simulated seconds per real second")
    args = ap.parse_args()
    out = []
    for seed in range(args.seeds):
        o = one(seed, args.nodes, args.degraded, args.factor, args.max_nodes, args.speed)
        out.append(o)
        print(f"seed {seed:2d}: degraded {', '.join(o.degraded)}: {o.pair_runs} pair runs ({o.repairs} re-pairs; "
              f"bound {o.bound}), culprits {', '.join(o.culprits) or 'none'}, missed {', '.join(o.missed) or 'none'}, "
              f"healthy held {len(o.healthy_held)}{' ' + ', '.join(o.healthy_held) if o.healthy_held else ''} "
              f"({o.seconds:.1f} s)")
    runs = [o.pair_runs for o in out]
    print(f"\n{len(out)} seeds, {args.nodes} nodes, {args.degraded} degraded at {args.factor}: pair runs "
          f"mean {statistics.mean(runs):.1f}, max {max(runs)} (bound {out[0].bound}; within it on "
          f"{sum(1 for o in out if o.pair_runs <= o.bound)} of {len(out)}); culprits named "
          f"{sum(len(o.culprits) for o in out)} of {args.degraded * len(out)}; healthy nodes held "
          f"{sum(len(o.healthy_held) for o in out)}; {statistics.mean(o.seconds for o in out):.1f} s a seed")


if __name__ == "__main__":
    main()
