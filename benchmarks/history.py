"""The history at fleet scale: a database of 10,000 nodes and 1,000,000 check rows (100,000
sweeps of 10 checks and 10 metrics each), then the time of `sweeper history NODE`, of one
policy evaluation with the shipped policy (every history rule reading the database), of the
fleet report, and the database size per thousand sweeps.

    python -m benchmarks.history [--nodes 10000] [--sweeps-per-node 10] [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

from sweeper.cli import print_history
from sweeper.history import History
from sweeper.policy import decide, load_policy
from sweeper.report import gather, render

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("gpu.count", "gpu.model", "ecc.volatile_uncorrected", "row_remap", "nvlink.state", "pcie.link",
          "clocks.events", "thermal.margin", "xid", "nic.port")
METRICS = ("ecc.aggregate_corrected", "row_remap.corrected", "pcie.replay", "nvlink.replay", "gpu.temperature",
           "gpu.power", "gpu.thermal_margin", "efa.rx_drops", "xid.92", "nccl.busbw_largest")


def build(path: Path, nodes: int, per_node: int, seed: int = 1) -> float:
    rng = random.Random(seed)
    h = History(path)
    t0 = time.perf_counter()
    start = 1_790_000_000.0
    conn = h.db.conn
    sweep_id = 0
    with conn:
        for k in range(per_node):
            run = f"sw-{k}"
            conn.execute("insert into runs (id, started, finished, status, mode, host, taken, summary) values "
                         "(?, ?, ?, 'done', 'sweep', 'bench', ?, '{}')", [run, start + k * 86400,
                                                                           start + k * 86400 + 3000, nodes])
            sweeps, checks, metrics = [], [], []
            for n in range(nodes):
                sweep_id += 1
                node = f"node-{n:05d}"
                t = start + k * 86400 + n * 0.3
                bad = rng.random() < 0.002
                verdict = "reboot" if bad else "pass"
                sweeps.append((sweep_id, run, node, t, t + 300, "sweep-light", "p5.48xlarge", verdict,
                               json.dumps(["xid (GPU 3): XID 79"] if bad else ["all checks passed"]),
                               json.dumps(["xid|79"] if bad else []), "[]", t + 290, "default", verdict))
                for c in CHECKS:
                    failed = bad and c == "xid"
                    checks.append((sweep_id, node, t + 280, "sweeper-check", c, "fail" if failed else "pass",
                                   "fatal" if failed else "info", 3 if failed else None, "79" if failed else None,
                                   "XID 79 (GPU has fallen off the bus)" if failed else "ok"))
                for m in METRICS:
                    value = 476.0 - rng.random() * 6 if m == "nccl.busbw_largest" else rng.random() * 100
                    metrics.append((sweep_id, node, t + 280, m, None, value, ""))
            conn.executemany("insert into node_sweeps (id, run_id, node, started, finished, playbook, profile, "
                             "verdict, reasons, causes, rules, decided, policy, policy_verdict, dry_run, kind) "
                             "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 'sweep')", sweeps)
            conn.executemany("insert into checks (sweep_id, node, ts, source, name, status, severity, gpu, code, "
                             "message) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", checks)
            conn.executemany("insert into metrics (sweep_id, node, ts, name, gpu, value, unit) values "
                             "(?, ?, ?, ?, ?, ?, ?)", metrics)
    h.db.execute("analyze")
    h.close()
    return time.perf_counter() - t0


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--sweeps-per-node", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.db"
        build_s = build(path, args.nodes, args.sweeps_per_node)
        h = History(path)
        counts = h.counts()
        sweeps = counts["node_sweeps"]
        size = sum(p.stat().st_size for p in Path(tmp).glob("history.db*"))
        policy = load_policy(ROOT / "policies" / "default.yaml")
        node = f"node-{args.nodes // 2:05d}"
        now = 1_790_000_000.0 + args.sweeps_per_node * 86400

        def history_cmd() -> None:
            print_history(Console(file=io.StringIO(), width=160), h.node_history(node))

        doc = {"checks": [{"name": "xid", "status": "fail", "code": "79", "gpu": 3, "message": "XID 79"}],
               "metrics": [{"name": "nccl.busbw_largest", "value": 470.0}]}

        def evaluate() -> None:
            decide([doc], set(), policy, node=node, profile="p5.48xlarge", now=now, past=h)

        def report() -> None:
            render(gather(h, policy, now - 30 * 86400, now, 86400.0, {"p5.48xlarge": 460.0}))

        print(f"database: {args.nodes:,} nodes, {sweeps:,} sweeps, {counts['checks']:,} check rows, "
              f"{counts['metrics']:,} metric rows; built in {build_s:.1f} s")
        print(f"size: {size / 2**20:.1f} MiB, {size / 2**20 / (sweeps / 1000):.2f} MiB per 1,000 sweeps")
        print(f"sweeper history NODE:       {timed(history_cmd, args.repeat) * 1000:8.1f} ms")
        print(f"one policy evaluation:      {timed(evaluate, args.repeat) * 1000:8.1f} ms "
              f"({len(policy.trends)} trends, {len(policy.peers)} peer rules, ladders, relapses, failure rates)")
        print(f"fleet report (gather+HTML): {timed(report, max(1, args.repeat // 2)) * 1000:8.1f} ms")
        h.close()


if __name__ == "__main__":
    main()
