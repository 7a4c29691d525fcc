"""The history at fleet scale, on SQLite and on PostgreSQL: a store of 10 clusters, 50,000 nodes and
10,000,000 check rows (1,000,000 sweeps of 10 checks, 2 metrics each, 20 a node), built with
set-based SQL through the history's own bulk path (`INSERT ... SELECT` from a sequence:
generate_series on PostgreSQL, a recursive CTE on SQLite). Then the time of `sweeper history NODE`,
`nodes` (one cluster and `--cluster all`), the report's fleet page, one cluster's report, `cohorts`
(where the history has it), one policy evaluation and the pair queries a sweep makes, and the
writes per second one sweep run needs, with the store's size.

SQLite keeps one cluster's share (a file serves one cluster: --clusters 1, nodes and rows divided by
--clusters; --sqlite-fleet gives it the whole fleet); PostgreSQL holds the whole fleet.

    python -m benchmarks.history [--backend both|sqlite|postgresql] [--clusters 10] [--nodes 50000]
        [--rows 10000000] [--pairs 100000] [--repeat 5] [--postgres URL]
    python -m benchmarks.history --rows 1000000 --nodes 5000   # minutes, not tens of minutes

PostgreSQL: a database is made for the run on the server --postgres names (default
$SWEEPER_BENCH_POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/postgres) and dropped after.
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from sweeper.cli import print_history
from sweeper.config import Config
from sweeper.history import History, is_url, redact
from sweeper.policy import decide, load_policy
from sweeper.report import gather, overview, render, render_fleet
from sweeper.result import CheckResult, Metric, Result
from sweeper.views import fleet_node_rows, fleet_rows

ROOT = Path(__file__).resolve().parent.parent
START = 1_790_000_000.0
DAY = 86400.0
CHECKS = ("gpu.count", "gpu.model", "ecc.volatile_uncorrected", "row_remap", "nvlink.state", "pcie.link",
          "clocks.events", "thermal.margin", "xid", "nic.port")
METRICS = ("nccl.busbw_largest", "ecc.aggregate_corrected", "row_remap.corrected", "pcie.replay", "nvlink.replay",
           "gpu.temperature", "gpu.power", "gpu.thermal_margin", "efa.rx_drops", "xid.92")


@dataclass(frozen=True)
class Scale:
    clusters: int = 10
    nodes: int = 50_000  # in all clusters together
    rows: int = 10_000_000  # check rows
    checks: int = 10  # a sweep's checks
    metrics: int = 2  # a sweep's metrics
    pairs: int = 100_000

    @property
    def per_cluster(self) -> int:
        return max(1, self.nodes // self.clusters)

    @property
    def sweeps(self) -> int:
        return max(self.clusters * self.per_cluster, self.rows // self.checks)

    @property
    def days(self) -> int:
        return max(1, self.sweeps // (self.clusters * self.per_cluster))


class Sql:
    """What differs between the backends in the builder's SQL: the sequence and formatting numbers."""

    def __init__(self, backend: str) -> None:
        self.pg = backend == "postgresql"

    def seq(self, n: int) -> tuple[str, str]:
        """(a WITH clause or "", a FROM item) yielding x = 0 .. n-1."""
        if self.pg:
            return "", f"generate_series(0::bigint, {int(n) - 1}::bigint) as seq(x)"
        return f"with recursive seq(x) as (select 0 union all select x + 1 from seq where x < {int(n) - 1}) ", "seq"

    def name(self, prefix: str, expr: str, width: int) -> str:
        if self.pg:
            return f"('{prefix}' || lpad(({expr})::text, {width}, '0'))"
        return f"printf('{prefix}%0{width}d', {expr})"


def _names(names: tuple[str, ...], k: int) -> str:
    """The first k names as a one-column derived table (the same SQL on both backends)."""
    picked = [names[i % len(names)] + (f".{i // len(names)}" if i >= len(names) else "") for i in range(k)]
    return "(" + " union all ".join(f"select '{n}' as name" for n in picked) + ") as c"


def build_fleet(state: str, scale: Scale) -> float:
    """Fill an empty history at `state` (either backend) with `scale`'s rows; the seconds it took."""
    h = History(state, cluster="c00")
    q = Sql(h.backend)
    t0 = time.perf_counter()
    n, nc, c = scale.clusters * scale.per_cluster, scale.per_cluster, scale.clusters
    # sweep x: day x / n, cluster (x % n) / nc, node (x % n) % nc; ids 1..sweeps; run (day * clusters + cluster)
    k, cl, nd = f"(x / {n})", f"((x % {n}) / {nc})", f"((x % {n}) % {nc})"
    started = f"({START} + {k} * {DAY} + {nd} * 0.3)"
    bad = "((x * 2654435761) % 1000 < 2)"
    with_, from_ = q.seq(scale.sweeps)
    h.execute(
        f"{with_}insert into node_sweeps (id, cluster, run_id, node, started, finished, playbook, profile, verdict, "
        "reasons, dry_run, kind, causes, rules, decided, policy, policy_verdict) select x + 1, "
        f"{q.name('c', cl, 2)}, {q.name('sw-', f'({k} * {c} + {cl})', 7)}, {q.name('node-', nd, 5)}, {started}, {started} + 300, "
        f"'sweep-light.yaml', 'p5.48xlarge', case when {bad} then 'reboot' else 'pass' end, "
        f"case when {bad} then '[\"xid (GPU 3): XID 79\"]' else '[\"all checks passed\"]' end, 0, 'sweep', "
        f"case when {bad} then '[\"xid|79\"]' else '[]' end, '[]', {started} + 290, 'default', "
        f"case when {bad} then 'reboot' else 'pass' end from {from_}")
    with_, from_ = q.seq(c * scale.days)
    h.execute(f"{with_}insert into runs (id, cluster, started, finished, status, mode, host, taken, summary) select "
              f"{q.name('sw-', 'x', 7)}, {q.name('c', f'(x % {c})', 2)}, {START} + (x / {c}) * {DAY}, "
              f"{START} + (x / {c}) * {DAY} + 3000, 'done', 'sweep', 'bench', {nc}, '{{}}' from {from_}")
    fail = "(s.verdict = 'reboot' and c.name = 'xid')"
    h.execute(
        "insert into checks (cluster, sweep_id, node, ts, source, name, status, severity, gpu, code, message) "
        f"select s.cluster, s.id, s.node, s.finished - 20, 'sweeper-check', c.name, case when {fail} then 'fail' "
        f"else 'pass' end, case when {fail} then 'fatal' else 'info' end, case when {fail} then 3 end, "
        f"case when {fail} then '79' end, case when {fail} then 'XID 79 (GPU has fallen off the bus)' else 'ok' end "
        f"from node_sweeps s cross join {_names(CHECKS, scale.checks)}")
    if scale.metrics:
        h.execute(
            "insert into metrics (cluster, sweep_id, node, ts, name, gpu, value, unit) select s.cluster, s.id, "
            "s.node, s.finished - 20, c.name, null, case when c.name = 'nccl.busbw_largest' then 476.0 - "
            "(s.id % 600) / 100.0 else ((s.id * 31) % 1000) / 10.0 end, '' from node_sweeps s "
            f"cross join {_names(METRICS, scale.metrics)}")
    if scale.pairs:
        # pair y: the sweep (y * 7) % sweeps and a partner of its cluster; 1% fail
        x = f"((y * 7) % {scale.sweeps})"
        with_, from_ = q.seq(scale.pairs)
        pk, pcl, pnd = f"({x} / {n})", f"(({x} % {n}) / {nc})", f"(({x} % {n}) % {nc})"
        failed = "((y * 40503) % 100 = 0)"
        h.execute(
            f"{with_}insert into pairs (cluster, run_id, ts, node, partner, status, mode, busbw, detail, "
            f"node_sweep_id, partner_sweep_id) select {q.name('c', pcl, 2)}, {q.name('sw-', f'({pk} * {c} + {pcl})', 7)}, "
            f"{START} + {pk} * {DAY} + {pnd} * 0.3 + 200, {q.name('node-', pnd, 5)}, "
            f"{q.name('node-', f'(({pnd} + 1 + y % 7) % {nc})', 5)}, case when {failed} then 'fail' else 'pass' end, "
            f"'sweep', case when {failed} then 80.0 else 470.0 end, '', {x} + 1, null "
            f"from (select x as y from {from_}) as ys")
        # what pair_result keeps as it writes: each node's latest conclusive result, per cluster
        h.execute(
            "insert into pair_latest (cluster, node, ts, pair_id, partner, status, mode, role) select cluster, n, ts, "
            "id, other, status, mode, role from (select u.*, row_number() over (partition by cluster, n order by "
            "ts desc, id desc) as rk from (select cluster, id, ts, node as n, partner as other, status, mode, "
            "'node' as role from pairs union all select cluster, id, ts, partner, node, status, mode, 'partner' "
            "from pairs) as u where status in ('pass', 'warn', 'fail')) as r where rk = 1")
    # The facts `sweeper cohorts` reads, written when they change: every node's driver at its first sweep,
    # and a quarter of the nodes moved to a newer one half-way through.
    half = f"{START} + {scale.days // 2} * {DAY}"
    h.execute("insert into facts (cluster, node, run_id, key, value, ts) select cluster, node, run_id, 'driver', "
              f"'570.133.20', started from node_sweeps where started < {START} + {DAY}")
    h.execute("insert into facts (cluster, node, run_id, key, value, ts) select cluster, node, run_id, 'driver', "
              f"'580.95.05', started from node_sweeps where started >= {half} and started < {half} + {DAY} "
              "and id % 4 = 0")
    h.analyze()  # and each node's latest sweep (node_latest) made from the sweeps loaded, as the Recorder keeps it
    h.close()
    return time.perf_counter() - t0


def build(path: Path, nodes: int, per_node: int, pairs: int = 0, seed: int = 1) -> float:
    """One cluster of `nodes` nodes, `per_node` sweeps each of 10 checks and 10 metrics (benchmarks.cli)."""
    return build_fleet(str(path), Scale(clusters=1, nodes=nodes, rows=nodes * per_node * 10, metrics=10, pairs=pairs))


def timed(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cohorts_hook(h: History, since: float) -> Callable[[], Any] | None:
    """`sweeper cohorts --by driver`: timed where this Sweeper has it (sweeper.cohorts.cohort_report,
    or a `cohorts` query of the history), else None. The builder writes no facts of its own: where
    the facts come from the sweeps' rows, they are timed as recorded."""
    try:
        from sweeper.cohorts import cohort_report  # type: ignore[import-not-found]
    except ImportError:
        query = getattr(h, "cohorts", None)
        return None if query is None else lambda: query(since)
    return lambda: cohort_report(h, "driver", since)


def sweep_run_writes(state: str, nodes: int) -> tuple[int, float]:
    """One sweep run of `nodes` nodes as the Recorder writes it (run, intents before and after, the
    sweep, its 10 checks and 10 metrics, the verdict, the release): (transactions, seconds)."""
    h = History(state, cluster="bench-writer")
    writes = 0
    t0 = time.perf_counter()
    run, now = f"bench-{secrets.token_hex(3)}", START + 400 * DAY
    h.run_started(run, now, "sweep")
    for i in range(nodes):
        node = f"node-{i:05d}"
        h.intent(run, node, now, "taint", "before")
        sid = h.sweep_started(run, node, now, "sweep-light.yaml", "p5.48xlarge")
        h.result(sid, Result(node=node, source="sweeper", started=now, finished=now + 30,
                             checks=tuple(CheckResult(c, "pass") for c in CHECKS),
                             metrics=tuple(Metric(m, 1.0, "") for m in METRICS)))
        h.sweep_finished(sid, now + 60, "pass", ["all checks passed"],
                         {"causes": [], "rules": [], "decided": now + 60, "policy": "default", "verdict": "pass"})
        h.intent(run, node, now + 61, "untaint", "after", "verdict pass")
        h.action(run, node, now + 62, "release", "pass")
        writes += 6
    h.run_finished(run, now + 600, "done", nodes, {})
    seconds = time.perf_counter() - t0
    h.close()
    return writes + 2, seconds


def measure(state: str, scale: Scale, repeat: int, run_nodes: int) -> None:
    h = History(state, cluster="c00")
    every = h.for_cluster(None)
    counts = every.counts()
    size = (h.query("select pg_database_size(current_database()) as b")[0]["b"] if h.backend == "postgresql"
            else sum(p.stat().st_size for p in Path(state).parent.glob(Path(state).name + "*")))
    print(f"  store: {len(every.clusters())} clusters, {scale.clusters * scale.per_cluster:,} nodes, "
          f"{counts['node_sweeps']:,} sweeps, {counts['checks']:,} check rows, {counts['metrics']:,} metric rows, "
          f"{counts['pairs']:,} pair results; {size / 2**20:,.0f} MiB")
    cfg, policy = Config(), load_policy(ROOT / "policies" / "default.yaml")
    now = START + scale.days * DAY
    node = f"node-{scale.per_cluster // 2:05d}"
    figures: list[tuple[str, Callable[[], Any], int]] = [
        ("sweeper history NODE", lambda: print_history(Console(file=io.StringIO(), width=160), h.node_history(node)),
         repeat),
        (f"sweeper nodes ({scale.per_cluster:,} nodes)", lambda: fleet_rows(h, cfg, None, now), repeat),
        (f"sweeper nodes --cluster all ({scale.clusters * scale.per_cluster:,})",
         lambda: fleet_node_rows(every, cfg, None, now), max(1, repeat // 2)),
        ("report: the fleet page", lambda: render_fleet(overview(every, now - 30 * DAY, now), {}, now,
                                                        now - 30 * DAY), repeat),
        ("report: one cluster (gather+HTML)", lambda: render(gather(h, policy, now - 30 * DAY, now, DAY,
                                                                    {"p5.48xlarge": 460.0})), 1),
    ]
    cohorts = cohorts_hook(h, now - 30 * DAY)
    doc = {"checks": [{"name": "xid", "status": "fail", "code": "79", "gpu": 3, "message": "XID 79"}],
           "metrics": [{"name": "nccl.busbw_largest", "value": 470.0}]}
    window = now - 7 * DAY
    figures += [
        ("one policy evaluation", lambda: decide([doc], set(), policy, node=node, profile="p5.48xlarge", now=now,
                                                 past=h), repeat),
        ("known-good nodes (7d)", lambda: h.known_good(window), repeat),
        ("pair suspects (7d)", lambda: h.pair_suspects(window), repeat),
        ("one node's pair results", lambda: h.pair_results(node, window, now), repeat),
    ]
    for label, fn, times in figures:
        print(f"  {label + ':':<44}{timed(fn, times) * 1000:10.1f} ms")
    if cohorts is None:
        print(f"  {'cohorts:':<44}not available (no sweeper.cohorts here)")
    else:
        print(f"  {'cohorts --by driver (one cluster):':<44}{timed(cohorts, 1) * 1000:10.1f} ms")
    writes, seconds = sweep_run_writes(state, run_nodes)
    print(f"  one sweep run of {run_nodes} nodes: {writes} writes (transactions) in {seconds:.2f} s: "
          f"{writes / seconds:,.0f} writes/s, {run_nodes * (len(CHECKS) + len(METRICS)) / seconds:,.0f} result rows/s")
    h.close()


@contextmanager
def scratch_database(server: str) -> Iterator[str]:
    """A PostgreSQL database made for this run on `server`, dropped after: its URL."""
    import sqlalchemy as sa

    url = sa.engine.make_url(server).set(drivername="postgresql+psycopg")
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    name = f"sweeper_bench_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'create database "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'drop database if exists "{name}" with (force)'))
        admin.dispose()


def run_backend(backend: str, scale: Scale, args: argparse.Namespace) -> None:
    if backend == "sqlite" and not args.sqlite_fleet:
        scale = replace(scale, clusters=1, nodes=scale.per_cluster, rows=scale.rows // scale.clusters,
                        pairs=scale.pairs // scale.clusters)
    print(f"{backend}: {scale.clusters} clusters x {scale.per_cluster:,} nodes, {scale.sweeps:,} sweeps "
          f"({scale.days} a node), {scale.sweeps * scale.checks:,} check rows, {scale.pairs:,} pair results")
    with tempfile.TemporaryDirectory() as tmp:
        place = scratch_database(args.postgres) if backend == "postgresql" else _nothing(str(Path(tmp) / "h.db"))
        with place as state:
            where = redact(state) if is_url(state) else state
            print(f"  built in {build_fleet(state, scale):.1f} s at {where}")
            measure(state, scale, args.repeat, args.run_nodes)


@contextmanager
def _nothing(value: str) -> Iterator[str]:
    yield value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("both", "sqlite", "postgresql"), default="both")
    ap.add_argument("--clusters", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=50_000, help="nodes in all clusters together")
    ap.add_argument("--rows", type=int, default=10_000_000, help="check rows (10 a sweep)")
    ap.add_argument("--metrics", type=int, default=2, help="metric rows a sweep")
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--run-nodes", type=int, default=50, help="nodes of the sweep run whose writes are timed")
    ap.add_argument("--sqlite-fleet", action="store_true", help="SQLite holds the whole fleet too")
    ap.add_argument("--postgres", default=os.environ.get("SWEEPER_BENCH_POSTGRES_URL")
                    or "postgresql://postgres@127.0.0.1:5432/postgres", help="a server to make a database on")
    args = ap.parse_args()
    scale = Scale(args.clusters, args.nodes, args.rows, 10, args.metrics, args.pairs)
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        run_backend(backend, scale, args)


if __name__ == "__main__":
    main()
