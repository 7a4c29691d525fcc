"""`sweeper cohorts` at fleet scale: a history of N nodes swept once a day for D days, each sweep with
its facts (driver, CUDA, VBIOS, board, zone, rack, eight GPU serials and VBIOS: 20 facts), a quarter of
the fleet moving to a new driver from day 3 that fails 5% of its node-days against a baseline of 0.5%
(facts written when they change, as the history writes them).
Then the time of the history's query (`History.cohort_rows`), of one `sweeper cohorts --by driver`
(query, node-days, tests), of its rollout backtest (a test a day), and of the fleet report's section
(six facts), and the database size of the facts per thousand sweeps.

    python -m benchmarks.cohorts [--nodes 2000] [--days 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.history import timed
from sweeper.cohorts import DAY, backtest_rollout, cohort_report, node_days
from sweeper.history import History
from sweeper.report.cohorts import gather_cohorts

START = 1_790_000_000.0
NEW = "580.65.06"


def build(path: Path, nodes: int, days: int, seed: int = 1) -> tuple[float, int]:
    """The history, written in bulk (the rows History.sweep_started, result and facts write)."""
    rng = random.Random(seed)
    h = History(path)
    conn = h.db.conn
    movers = {f"node-{n:05d}": 3 + i // max(1, nodes // 100) for i, n in enumerate(rng.sample(range(nodes), nodes // 4))}
    t0, sweep_id, facts_rows = time.perf_counter(), 0, 0
    with conn:
        for d in range(days):
            run = f"sw-{d:03d}"
            conn.execute("insert into runs (id, started, finished, status, mode, host, taken, summary) values "
                         "(?, ?, ?, 'done', 'sweep', 'bench', ?, '{}')", [run, START + d * DAY, START + d * DAY + 3000,
                                                                          nodes])
            sweeps, facts = [], []
            for n in range(nodes):
                sweep_id += 1
                node, t = f"node-{n:05d}", START + d * DAY + n * 0.3
                new = node in movers and d >= movers[node]
                bad = rng.random() < (0.05 if new else 0.005)
                sweeps.append((sweep_id, run, node, t, t + 300, "replace" if bad else "pass",
                               json.dumps(["dcgm.pcie|DCGM_FR_PCIE_REPLAY" if new else "xid|79"] if bad else [])))
                fs = {"driver": NEW if new else "570.133.20", "cuda": "13.0" if new else "12.8",
                      "vbios": "96.00.DA.00.0C", "board": "692-2G520-0200-000", "zone": f"us-east-1{'abcd'[n % 4]}",
                      "rack": f"rack-{n // 16:04d}", "instance-type": "p5.48xlarge"}
                fs |= {f"gpu.{g}.serial": f"1652{n:05d}{g:04d}" for g in range(8)}
                fs |= {f"gpu.{g}.vbios": "96.00.DA.00.0C" for g in range(5)}
                if d == 0 or (new and d == movers[node]):  # written when they change, as History.facts does
                    facts += [(node, run, k, v, t + 280) for k, v in fs.items() if d == 0 or k in ("driver", "cuda")]
            conn.executemany("insert into node_sweeps (id, run_id, node, started, finished, playbook, profile, verdict, "
                             "reasons, causes, rules, dry_run, kind) values (?, ?, ?, ?, ?, 'sweep-light', "
                             "'p5.48xlarge', ?, '[]', ?, '[]', 0, 'sweep')", sweeps)
            conn.executemany("insert into facts (node, run_id, key, value, ts) values (?, ?, ?, ?, ?)", facts)
            facts_rows += len(facts)
    h.db.execute("analyze")
    h.close()
    return time.perf_counter() - t0, facts_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.db"
        built, facts_rows = build(path, args.nodes, args.days)
        h = History(path)
        size = path.stat().st_size
        sweeps = args.nodes * args.days
        print(f"history: {args.nodes} nodes x {args.days} days = {sweeps} sweeps, {facts_rows} fact rows, "
              f"{size / 2**20:.1f} MiB ({size / sweeps * 1000 / 2**20:.2f} MiB per 1000 sweeps), built in {built:.1f}s")
        doc = cohort_report(h, "driver", START)
        print(f"flagged by driver: {doc['flagged']} of {len(doc['cohorts'])} cohorts")
        rows = h.cohort_rows("driver", START)
        days = node_days(rows, START)
        bt = backtest_rollout(days, NEW)
        print(f"backtest {NEW}: flagged on day {bt['flagged_day']}, {bt['spared']} of {bt['joined_after']} nodes that "
              f"joined after would not have failed")
        for what, fn in (("History.cohort_rows('driver')", lambda: h.cohort_rows("driver", START)),
                         ("sweeper cohorts --by driver", lambda: cohort_report(h, "driver", START)),
                         ("sweeper cohorts --by rack", lambda: cohort_report(h, "rack", START)),
                         ("--backtest (a test a day)", lambda: backtest_rollout(node_days(h.cohort_rows(
                             "driver", START), START), NEW)),
                         ("the report's section (6 facts)", lambda: gather_cohorts(h, START))):
            print(f"{what:34s} {timed(fn, args.repeat) * 1000:9.1f} ms (median of {args.repeat})")
        h.close()


if __name__ == "__main__":
    main()
