"""The history at fleet scale: a database of 10,000 nodes and 1,000,000 check rows (100,000
sweeps of 10 checks and 10 metrics each) and 1,000,000 pair results, then the time of
`sweeper history NODE`, of one policy evaluation with the shipped policy (every history rule
reading the database, the pair rule included), of the pair queries a sweep makes (known-good
nodes, suspects waiting for a re-pair, one node's pair results), of the fleet report, and the
database size per thousand sweeps and per thousand pair results.

    python -m benchmarks.history [--nodes 10000] [--sweeps-per-node 10] [--pairs 1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sqlite3
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


def build(path: Path, nodes: int, per_node: int, pairs: int = 0, seed: int = 1) -> float:
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
        # Pair results spread over the same days: 1% of pairs fail, and each failure is followed by a
        # re-pair of its first node with a random partner (half of them failing again).
        span = per_node * 86400.0
        rows = []
        while len(rows) < pairs:
            a, b = rng.sample(range(nodes), 2)
            t = start + rng.random() * span
            sid = rng.randrange(1, sweep_id + 1) if sweep_id else None
            if rng.random() < 0.01:
                rows.append((f"sw-{int((t - start) // 86400)}", t, f"node-{a:05d}", f"node-{b:05d}", "fail", "sweep",
                             rng.uniform(20, 120), "pair.nccl: busbw below the floor", sid, sid))
                c = rng.randrange(nodes)
                bad = rng.random() < 0.5
                rows.append((f"sw-{int((t - start) // 86400)}", t + 1800, f"node-{a:05d}", f"node-{c:05d}",
                             "fail" if bad else "pass", "repair", rng.uniform(20, 120) if bad else 476.0, "", sid, sid))
            else:
                rows.append((f"sw-{int((t - start) // 86400)}", t, f"node-{a:05d}", f"node-{b:05d}", "pass", "sweep",
                             476.0 - rng.random() * 6, "", sid, sid))
        conn.executemany("insert into pairs (run_id, ts, node, partner, status, mode, busbw, detail, node_sweep_id, "
                         "partner_sweep_id) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows[:pairs])
        # what History.pair_result keeps as it writes: each node's latest conclusive pair result (the
        # other columns come from the row of max(ts): https://www.sqlite.org/lang_select.html#bareagg)
        conn.execute("insert into pair_latest (node, ts, pair_id, partner, status, mode, role) "
                     "select n, max(ts), id, other, status, mode, role from (select id, ts, node as n, partner as other, "
                     "status, mode, 'node' as role from pairs union all select id, ts, partner, node, status, mode, "
                     "'partner' from pairs) where status in ('pass', 'warn', 'fail') group by n")
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
    ap.add_argument("--pairs", type=int, default=1_000_000, help="pair results to record")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.db"
        build_s = build(path, args.nodes, args.sweeps_per_node, args.pairs)
        h = History(path)
        counts = h.counts()
        sweeps = counts["node_sweeps"]
        size = sum(p.stat().st_size for p in Path(tmp).glob("history.db*"))
        try:  # the pair tables' share, where SQLite has its dbstat table
            with sqlite3.connect(path) as conn:
                pair_size = conn.execute("select sum(pgsize) from dbstat where name like '%pair%'").fetchone()[0] or 0
        except sqlite3.OperationalError:
            pair_size = 0
        policy = load_policy(ROOT / "policies" / "default.yaml")
        node = f"node-{args.nodes // 2:05d}"
        now = 1_790_000_000.0 + args.sweeps_per_node * 86400

        def history_cmd() -> None:
            print_history(Console(file=io.StringIO(), width=160), h.node_history(node))

        doc = {"checks": [{"name": "xid", "status": "fail", "code": "79", "gpu": 3, "message": "XID 79"}],
               "metrics": [{"name": "nccl.busbw_largest", "value": 470.0}]}

        def evaluate() -> None:
            decide([doc], set(), policy, node=node, profile="p5.48xlarge", now=now, past=h)

        window = now - 7 * 86400  # pair_known_good_window's default

        def report() -> None:
            render(gather(h, policy, now - 30 * 86400, now, 86400.0, {"p5.48xlarge": 460.0}))

        print(f"database: {args.nodes:,} nodes, {sweeps:,} sweeps, {counts['checks']:,} check rows, "
              f"{counts['metrics']:,} metric rows, {counts['pairs']:,} pair results; built in {build_s:.1f} s")
        print(f"size: {size / 2**20:.1f} MiB, {(size - pair_size) / 2**20 / (sweeps / 1000):.2f} MiB per 1,000 sweeps"
              + (f", {pair_size / 2**20 / (counts['pairs'] / 1000):.2f} MiB per 1,000 pair results"
                 if pair_size and counts["pairs"] else ""))
        print(f"sweeper history NODE:       {timed(history_cmd, args.repeat) * 1000:8.1f} ms")
        print(f"one policy evaluation:      {timed(evaluate, args.repeat) * 1000:8.1f} ms "
              f"({len(policy.trends)} trends, {len(policy.peers)} peer rules, ladders, relapses, failure rates, "
              f"{len(policy.pair_failures)} pair rule)")
        good: set[str] = set()
        suspects: dict[str, str] = {}

        def known_good() -> None:
            good.update(h.known_good(window))

        def pair_suspects() -> None:
            suspects.update(h.pair_suspects(window))

        print(f"known-good nodes (7d):      {timed(known_good, args.repeat) * 1000:8.1f} ms ({len(good):,} nodes)")
        print(f"pair suspects (7d):         {timed(pair_suspects, args.repeat) * 1000:8.1f} ms ({len(suspects):,} nodes)")
        print(f"one node's pair results:    {timed(lambda: h.pair_results(node, window, now), args.repeat) * 1000:8.1f} ms "
              f"({len(h.pair_results(node, window, now))} rows)")
        print(f"fleet report (gather+HTML): {timed(report, max(1, args.repeat // 2)) * 1000:8.1f} ms")
        h.close()


if __name__ == "__main__":
    main()
