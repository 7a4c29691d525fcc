"""The SQLite history: runs, node sweeps, checks, metrics, actions and the intent log.
The only importer of `sqlite_utils`; the sweep sees it through the Recorder protocol.

Reads and the sweep's own writes go through the standard library's sqlite3 alone:
`sqlite_utils` (some 50 ms of imports) is loaded for migrations, pruning and the switches, so
`sweeper history NODE` and the other reading commands never pay for it."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sweeper.errors import StateError
from sweeper.result import NODE_LOWEST, NODE_SETTINGS

if TYPE_CHECKING:
    from sqlite_utils import Database
    from sqlite_utils.migrations import Migrations

    from sweeper.result import Result


def m001_initial(db: Database) -> None:
    db.table("runs").create({"id": str, "started": float, "finished": float, "status": str, "mode": str,
                       "host": str, "taken": int, "summary": str}, pk="id")
    db.table("node_sweeps").create({"id": int, "run_id": str, "node": str, "started": float, "finished": float,
                              "playbook": str, "profile": str, "verdict": str, "reasons": str, "dry_run": int},
                             pk="id", foreign_keys=[("run_id", "runs", "id")])
    db.table("checks").create({"id": int, "sweep_id": int, "node": str, "ts": float, "source": str, "name": str,
                         "status": str, "severity": str, "gpu": int, "code": str, "message": str},
                        pk="id", foreign_keys=[("sweep_id", "node_sweeps", "id")])
    db.table("metrics").create({"id": int, "sweep_id": int, "node": str, "ts": float, "name": str, "gpu": int,
                          "value": float, "unit": str}, pk="id", foreign_keys=[("sweep_id", "node_sweeps", "id")])
    db.table("actions").create({"id": int, "run_id": str, "node": str, "ts": float, "action": str, "detail": str,
                          "dry_run": int}, pk="id")
    db.table("intents").create({"id": int, "run_id": str, "node": str, "ts": float, "op": str, "phase": str,
                          "detail": str}, pk="id")
    db.table("node_sweeps").create_index(["node", "started"])
    db.table("checks").create_index(["node", "ts"])
    db.table("checks").create_index(["sweep_id"])
    db.table("metrics").create_index(["node", "name", "ts"])
    db.table("metrics").create_index(["name", "ts"])
    db.table("actions").create_index(["node", "ts"])
    db.table("intents").create_index(["run_id", "node"])


def m002_controls(db: Database) -> None:
    db.table("controls").create({"key": str, "value": str, "ts": float}, pk="key")
    db.table("node_sweeps").create_index(["verdict", "finished"])


def m003_sweep_kind(db: Database) -> None:
    # 'sweep': the node was held and checked; 'light': read-only checks on a busy node, never held.
    db.table("node_sweeps").add_column("kind", str, not_null_default="sweep")


def m004_policy(db: Database) -> None:
    # What the policy decided on: the causes (check|code) behind the verdict, the history rules
    # that raised it, and when it was decided (what a backtest replays up to).
    db.table("node_sweeps").add_column("causes", str, not_null_default="[]")
    db.table("node_sweeps").add_column("rules", str, not_null_default="[]")
    db.table("node_sweeps").add_column("decided", float)
    db.table("node_sweeps").add_column("policy", str)
    db.table("node_sweeps").add_column("policy_verdict", str)  # before the safety caps (replacements per hour)
    # What `sweeper state prune` keeps of the sweeps it deletes: one row a node a day.
    db.table("summaries").create({"node": str, "day": str, "sweeps": int, "verdicts": str, "metrics": str},
                                 pk=("node", "day"))
    db.table("metrics").create_index(["sweep_id"])
    db.table("node_sweeps").create_index(["profile", "finished"])


def m005_pairs(db: Database) -> None:
    # One row a pair run: node A and partner B (in a re-pair: the suspect and its known-good
    # partner), the pair's status, its mode (sweep | repair), the bus bandwidth and each side's
    # sweep row. Read from either side, by time: the indexes serve one node's rows, and the
    # fleet's pairs of one status and mode in a window (failures are few among many passes).
    db.table("pairs").create({"id": int, "run_id": str, "ts": float, "node": str, "partner": str, "status": str,
                              "mode": str, "busbw": float, "detail": str, "node_sweep_id": int,
                              "partner_sweep_id": int}, pk="id")
    db.table("pairs").create_index(["node", "ts"])
    db.table("pairs").create_index(["partner", "ts"])
    db.table("pairs").create_index(["status", "mode", "ts"])
    db.table("pairs").create_index(["node_sweep_id"])
    db.table("pairs").create_index(["partner_sweep_id"])
    # Each node's latest conclusive pair result (pass, warn or fail), kept as pairs are written, so
    # that who is known-good and who waits for a re-pair is read in one pass over the nodes,
    # not over every pair of the window.
    db.table("pair_latest").create({"node": str, "ts": float, "pair_id": int, "partner": str, "status": str,
                                    "mode": str, "role": str}, pk="node")
    db.table("pair_latest").create_index(["ts"])


CONCLUSIVE_PAIRS = ("pass", "warn", "fail")  # a pair's statuses that say something about the fabric


MIGRATIONS = (m001_initial, m002_controls, m003_sweep_kind, m004_policy, m005_pairs)
KNOWN = [m.__name__ for m in MIGRATIONS]
MIGRATIONS_TABLE = "_sqlite_migrations"  # where sqlite_utils.Migrations records what it applied


def _migrations() -> Migrations:
    """The schema as one sqlite_utils migration set, built when a file needs one applied."""
    from sqlite_utils.migrations import Migrations

    migrations = Migrations("sweeper")
    for fn in MIGRATIONS:
        migrations()(fn)
    return migrations


KNOWN_TABLES = frozenset({"runs", "node_sweeps", "checks", "metrics", "actions", "intents", "controls", "summaries",
                          "pairs", "pair_latest", MIGRATIONS_TABLE})


def _migration_tables() -> frozenset[str]:
    """The tables the migrations make, read from a fresh in-memory database."""
    from sqlite_utils import Database

    db = Database(memory=True, execute_plugins=False)
    _migrations().apply(db)
    return frozenset(db.table_names())


F = TypeVar("F", bound=Callable[..., Any])


def _locked(fn: F) -> F:
    """One connection is shared by the sweep's threads; each call holds it alone."""
    def wrapper(self: History, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            try:
                return fn(self, *args, **kwargs)
            except sqlite3.Error as exc:
                raise StateError(f"history {self.path}: {exc}") from exc
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper  # type: ignore[return-value]


class History:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open the history at {self.path}: {exc}") from exc
        self.conn = conn
        self._db: Database | None = None
        # Switching to WAL and migrating take locks that SQLite does not wait for through its busy
        # timeout; a second process opening a new file at the same moment retries here.
        for attempt in range(50):
            try:
                self._open()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 49:
                    raise StateError(f"cannot open the history at {self.path}: {exc}") from exc
                time.sleep(0.1)
            except sqlite3.DatabaseError as exc:  # "file is not a database": a corrupt or foreign file
                raise StateError(f"cannot open the history at {self.path}: {exc} (a corrupt file, or not a "
                                 "Sweeper history)") from exc

    def _open(self) -> None:
        self.conn.execute("PRAGMA busy_timeout = 30000")
        # No SQL function runs from the file's own schema (a view, trigger or default) unless it is
        # harmless; and a file with objects the migrations never make is refused before any read.
        self.conn.execute("PRAGMA trusted_schema = OFF")
        self._refuse_foreign_schema()
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self.conn.execute("PRAGMA journal_mode = wal")
        applied = self._applied()
        unknown = [n for n in applied if n not in KNOWN]
        if unknown:
            raise StateError(f"{self.path} was written by a newer Sweeper (migrations {unknown} are unknown "
                             "to this version); upgrade Sweeper or point --state at another file")
        if len(set(applied)) < len(KNOWN):
            _migrations().apply(self.db)

    def _refuse_foreign_schema(self) -> None:
        """A trigger could rewrite what is recorded (a `fail` into a `pass`) or loop on every insert,
        a view could stand in for a table: the file is refused unless its tables, and nothing
        else but their indexes, are those of the migrations."""
        rows = self.conn.execute("select type, name, tbl_name, sql from sqlite_master").fetchall()
        foreign = [f"{kind} {name!r}" for kind, name, _, sql in rows
                   if kind not in ("table", "index") or (kind == "table" and str(sql or "").lstrip().upper()
                                                          .startswith("CREATE VIRTUAL"))]
        tables = {name for kind, name, _, _ in rows if kind == "table" and not name.startswith("sqlite_")}
        extra = tables - KNOWN_TABLES
        if extra:  # a migration newer than KNOWN_TABLES may have made it: ask the migrations themselves
            extra = tables - _migration_tables()
        foreign += [f"table {name!r}" for name in sorted(extra)]
        if foreign:
            raise StateError(f"{self.path} is not a Sweeper history as its migrations make it (it has "
                             f"{', '.join(foreign[:5])}); refused, so that nothing in the file runs")

    def _applied(self) -> list[str]:
        """The names of the migrations this file has, as sqlite_utils.Migrations recorded them."""
        if not self.conn.execute("select 1 from sqlite_master where type = 'table' and name = ?",
                                 [MIGRATIONS_TABLE]).fetchone():
            return []
        return [r[0] for r in self.conn.execute(f"select name from {MIGRATIONS_TABLE} where migration_set = "
                                                "'sweeper' order by rowid")]

    @property
    def db(self) -> Database:
        """The connection as a sqlite_utils Database, for writes and migrations (made on first use)."""
        with self._lock:
            if self._db is None:
                from sqlite_utils import Database

                # no plugin entry-point scan: faster start, same behaviour
                self._db = Database(self.conn, execute_plugins=False)
            return self._db

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows as dicts, read with the standard library alone."""
        cur = self.conn.execute(sql, params)
        keys = [d[0] for d in cur.description]
        return [dict(zip(keys, row, strict=True)) for row in cur]

    def close(self) -> None:
        self.conn.close()

    # -- the Recorder protocol ----------------------------------------------------
    # Plain INSERT and UPDATE statements, one commit each: the sweep's threads share the
    # connection, so each write holds it for as few statements (and GIL hand-overs) as it can.
    def _write(self, table: str, row: dict[str, Any], where_id: Any = None) -> int:
        """Insert `row` into `table`, or update the row whose id is `where_id`, and commit; lists
        and dicts are stored as JSON. The new row's id."""
        values = [json.dumps(v) if isinstance(v, (dict, list, tuple)) else v for v in row.values()]
        with self.conn:
            if where_id is None:
                cur = self.conn.execute(f"insert into {table} ({', '.join(row)}) values "
                                        f"({', '.join('?' * len(row))})", values)
            else:
                cur = self.conn.execute(f"update {table} set {', '.join(f'{k} = ?' for k in row)} where id = ?",
                                        [*values, where_id])
        return int(cur.lastrowid or 0)

    @_locked
    def run_started(self, run_id: str, started: float, mode: str) -> None:
        from socket import gethostname

        self._write("runs", {"id": run_id, "started": started, "finished": None, "status": "running",
                             "mode": mode, "host": gethostname(), "taken": 0, "summary": "{}"})

    @_locked
    def run_finished(self, run_id: str, finished: float, status: str, taken: int, summary: dict[str, Any]) -> None:
        self._write("runs", {"finished": finished, "status": status, "taken": taken, "summary": summary},
                    where_id=run_id)

    @_locked
    def sweep_started(self, run_id: str, node: str, started: float, playbook: str, profile: str,
                      dry_run: bool = False, kind: str = "sweep") -> int:
        return self._write("node_sweeps", {
            "run_id": run_id, "node": node, "started": started, "finished": None, "playbook": playbook,
            "profile": profile, "verdict": None, "reasons": "[]", "dry_run": int(dry_run), "kind": kind})

    @_locked
    def sweep_finished(self, sweep_id: int, finished: float, verdict: str, reasons: list[str],
                       decision: dict[str, Any] | None = None) -> None:
        """`decision`: what the policy decided on (causes, rules, decided, policy), when it ran."""
        row: dict[str, Any] = {"finished": finished, "verdict": verdict, "reasons": json.dumps(reasons)}
        if decision:
            row.update({"causes": json.dumps(list(decision.get("causes") or [])),
                        "rules": json.dumps(list(decision.get("rules") or [])),
                        "decided": decision.get("decided"), "policy": decision.get("policy"),
                        "policy_verdict": decision.get("verdict")})
        self._write("node_sweeps", row, where_id=sweep_id)

    @_locked
    def result(self, sweep_id: int | None, result: Result) -> None:
        with self.conn:
            self.conn.executemany(
                "insert into checks (sweep_id, node, ts, source, name, status, severity, gpu, code, message) "
                "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(sweep_id, result.node, result.finished, result.source, c.name, c.status, c.severity, c.gpu, c.code,
                  c.message) for c in result.checks])
            self.conn.executemany(
                "insert into metrics (sweep_id, node, ts, name, gpu, value, unit) values (?, ?, ?, ?, ?, ?, ?)",
                [(sweep_id, result.node, result.finished, m.name, m.gpu, m.value, m.unit) for m in result.metrics])

    @_locked
    def action(self, run_id: str, node: str, ts: float, action: str, detail: str, dry_run: bool = False) -> None:
        self._write("actions", {"run_id": run_id, "node": node, "ts": ts, "action": action, "detail": detail,
                                "dry_run": int(dry_run)})

    @_locked
    def intent(self, run_id: str, node: str, ts: float, op: str, phase: str, detail: str = "") -> None:
        self._write("intents", {"run_id": run_id, "node": node, "ts": ts, "op": op, "phase": phase,
                                "detail": detail})

    @_locked
    def pair_result(self, run_id: str, ts: float, node: str, partner: str, status: str, mode: str,
                    busbw: float | None, detail: str,
                    sweep_ids: tuple[int | None, int | None] = (None, None)) -> int:
        """One pair run: `node` is A (in a re-pair, the suspect), `partner` B (in a re-pair, the
        known-good partner); `mode` is sweep or repair; `sweep_ids` each side's sweep row."""
        with self.conn:
            cur = self.conn.execute(
                "insert into pairs (run_id, ts, node, partner, status, mode, busbw, detail, node_sweep_id, "
                "partner_sweep_id) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, ts, node, partner, status, mode, busbw, detail, sweep_ids[0], sweep_ids[1]])
            pair_id = int(cur.lastrowid or 0)
            if status in CONCLUSIVE_PAIRS:
                # An upsert whose update has a WHERE: a pair written late (an older ts) does not
                # overwrite a later result (https://www.sqlite.org/lang_upsert.html).
                self.conn.executemany(
                    "insert into pair_latest (node, ts, pair_id, partner, status, mode, role) values "
                    "(?, ?, ?, ?, ?, ?, ?) on conflict (node) do update set ts = excluded.ts, "
                    "pair_id = excluded.pair_id, partner = excluded.partner, status = excluded.status, "
                    "mode = excluded.mode, role = excluded.role where excluded.ts >= pair_latest.ts",
                    [(node, ts, pair_id, partner, status, mode, "node"),
                     (partner, ts, pair_id, node, status, mode, "partner")])
        return pair_id

    @_locked
    def last_swept(self, kind: str = "sweep") -> dict[str, float]:
        """Node to the start of its latest finished, conclusive, non-dry-run sweep of this kind:
        `sweep` (a single-node playbook) or `pair` (a pair playbook). Each has its own cadence, so
        that a daily node sweep never keeps a node from its pair sweep, nor the reverse."""
        rows = self._query("select node, max(started) as last from node_sweeps where finished is not null "
                           "and dry_run = 0 and kind = ? and verdict != 'inconclusive' group by node", [kind])
        return {r["node"]: r["last"] for r in rows}

    # Each node's latest conclusive pair result, either side, is kept in pair_latest as pairs are
    # written. Pairs that ended error or inconclusive (a fault of the tool, a race, a stopped run)
    # say nothing about the fabric of either node and are passed over.
    @_locked
    def known_good(self, since: float) -> set[str]:
        """Nodes whose latest conclusive pair result since `since` (either side) passed or warned."""
        return {r[0] for r in self.conn.execute("select node from pair_latest where ts >= ? and status in "
                                                "('pass', 'warn')", [since])}

    @_locked
    def pair_suspects(self, since: float) -> dict[str, str]:
        """Node to the partner of its failed pair, for nodes whose latest conclusive pair result
        since `since` is a failed pair of a sweep (not yet re-paired with a known-good partner)."""
        return dict(self.conn.execute("select node, partner from pair_latest where ts >= ? and status = 'fail' "
                                      "and mode = 'sweep'", [since]).fetchall())

    @_locked
    def xids_cleared(self, node: str) -> float | None:
        """When the node last left its XIDs behind: the start of its latest finished, non-dry-run sweep
        that passed or warned, or its latest GPU reset by Sweeper, whichever is later. The kernel log
        keeps an XID until the node reboots; one logged before this time was judged, or reset, already."""
        rows = self._query("select max(started) as t from node_sweeps where node = ? and finished is not null "
                           "and dry_run = 0 and kind in ('sweep', 'pair') and verdict in ('pass', 'warn') "
                           "union all select max(ts) as t from actions where node = ? and dry_run = 0 "
                           "and action = 'remediate-gpu-reset' and detail like 'gpus-reset:%'", [node, node])
        times = [float(r["t"]) for r in rows if r["t"] is not None]
        return max(times) if times else None

    @_locked
    def driver_version(self, node: str) -> str | None:
        """The NVIDIA driver version the node's own check last read through NVML (check
        `driver.version`), or None: what picks a DCGM build where the node carries no GFD labels."""
        rows = list(self._query("select message from checks where node = ? and name = 'driver.version' and "
                                "status = 'pass' order by ts desc, id desc limit 1", [node]))
        return str(rows[0]["message"]) if rows and rows[0]["message"] else None

    @_locked
    def last_light(self) -> dict[str, float]:
        """Node to the start of its latest light (read-only, busy-node) check."""
        rows = self._query("select node, max(started) as last from node_sweeps where kind = 'light' group by node")
        return {r["node"]: r["last"] for r in rows}

    @_locked
    def story(self, run_id: str, node: str) -> dict[str, Any]:
        """What a run recorded about a node: its latest sweep and its intents (for reconciling)."""
        sweeps = list(self._query("select * from node_sweeps where run_id = ? and node = ? order by id desc limit 1",
                                    [run_id, node]))
        intents = list(self._query("select op, phase, ts, detail from intents where run_id = ? and node = ? "
                                     "order by id", [run_id, node]))
        return {"sweep": sweeps[0] if sweeps else None, "intents": intents}

    @_locked
    def get_control(self, key: str) -> dict[str, Any] | None:
        rows = list(self._query("select value, ts from controls where key = ?", [key]))
        return {**json.loads(rows[0]["value"]), "ts": rows[0]["ts"]} if rows else None

    @_locked
    def set_control(self, key: str, value: dict[str, Any] | None, ts: float) -> None:
        if value is None:
            self.db.execute("delete from controls where key = ?", [key])
            self.db.conn.commit()
        else:
            self.db.table("controls").upsert({"key": key, "value": json.dumps(value), "ts": ts}, pk="key")

    @_locked
    def failures_since(self, since: float, verdicts: tuple[str, ...]) -> dict[str, int]:
        """Node to the number of its sweeps with one of these verdicts finished since `since`."""
        marks = ",".join("?" * len(verdicts))
        rows = self._query(f"select node, count(*) as n from node_sweeps where finished >= ? and dry_run = 0 "
                             f"and kind in ('sweep', 'pair') and verdict in ({marks}) group by node", [since, *verdicts])
        return {r["node"]: r["n"] for r in rows}

    @_locked
    def released_by_people(self, nodes: list[str], holding: tuple[str, ...]) -> list[dict[str, Any]]:
        """Nodes whose latest sweep held them, with no hand-back by Sweeper since: the given nodes no
        longer carry the taint, so a person released them. Each with the findings of that sweep.

        Sweeper's own hand-backs are read from the intent log: an `untaint` begun by any run after
        the holding verdict (unless that run then found another run's taint and left it) means
        Sweeper, not a person, released the node, even when the run died before recording it."""
        out = []
        for node in nodes:
            last = list(self._query("select * from node_sweeps where node = ? and finished is not null "
                                      "and dry_run = 0 and kind in ('sweep', 'pair') order by finished desc limit 1", [node]))
            if not last or last[0]["verdict"] not in holding:
                continue
            s = last[0]
            after = list(self._query("select 1 from actions where node = ? and ts >= ? and action in "
                                       "('release', 'false-positive') limit 1", [node, s["finished"]]))
            untainted = list(self._query(
                "select 1 from intents i where i.node = ? and i.ts >= ? and i.op = 'untaint' "
                "and i.phase in ('before', 'after') and not exists (select 1 from intents j where "
                "j.run_id = i.run_id and j.node = i.node and j.op = 'untaint' and j.phase = 'left' and j.id > i.id) "
                "limit 1", [node, s["finished"]]))
            if after or untainted:
                continue
            s["findings"] = list(self._query("select name, code, gpu from checks where sweep_id = ? "
                                               "and status = 'fail'", [s["id"]]))
            out.append(s)
        return out

    @_locked
    def unfinished_runs(self) -> list[str]:
        return [r["id"] for r in self._query("select id from runs where finished is null")]

    @_locked
    def open_sweeps(self, exclude_run: str) -> list[dict[str, Any]]:
        """Sweep rows (light checks included) left unfinished by runs other than `exclude_run`,
        each with `proven`: the verdict its run's intent log proves, or None."""
        rows = list(self._query("select id, run_id, node, started, kind from node_sweeps where finished is null "
                                  "and run_id != ? order by id", [exclude_run]))
        for r in rows:
            r["proven"] = self.proven_verdict(r["run_id"], r["node"])
        return rows

    @_locked
    def proven_verdict(self, run_id: str, node: str) -> dict[str, Any] | None:
        """The verdict a run's hand-back of a node proves, from the intent log: the hand-back only
        begins once the verdict is reached (`untaint` with `verdict V`, or `keep-held` V), so
        its first intent is enough. {"verdict", "ts"}, or None. A pair sweep may hold a node again
        within its run (a re-pair's partner): a new hold starts a new story, so only a hand-back
        after the run's latest `taint` of the node counts."""
        proven = None
        for r in self._query("select op, phase, ts, detail from intents where run_id = ? and node = ? "
                               "and op in ('untaint', 'keep-held', 'taint') order by id", [run_id, node]):
            detail = r["detail"] or ""
            if r["op"] == "taint":
                proven = None
            elif r["op"] == "keep-held" and detail:
                proven = {"verdict": detail, "ts": r["ts"]}
            elif r["op"] == "untaint" and detail.startswith("verdict "):
                proven = {"verdict": detail[len("verdict "):], "ts": r["ts"]}
        return proven

    # -- reading -----------------------------------------------------------------
    @_locked
    def node_history(self, node: str, since: float | None = None, limit: int = 50,
                     check: str = "") -> dict[str, Any]:
        """`check`: only findings and metrics whose name starts with it (e.g. `ecc`, `nvlink`)."""
        since = since or 0.0
        sweeps = list(self._query(
            "select * from node_sweeps where node = ? and started >= ? order by started desc limit ?",
            [node, since, limit]))
        for s in sweeps:
            s["reasons"] = json.loads(s["reasons"] or "[]")
            s["rules"] = json.loads(s.get("rules") or "[]")
            s["causes"] = json.loads(s.get("causes") or "[]")
            s["problems"] = list(self._query(
                "select source, name, status, severity, gpu, code, message from checks "
                "where sweep_id = ? and status in ('fail', 'error', 'warn') and name like ? order by id",
                [s["id"], check + "%"]))
        actions = list(self._query("select run_id, ts, action, detail, dry_run from actions "
                                     "where node = ? and ts >= ? order by ts desc limit ?", [node, since, limit]))
        metrics: dict[str, list[tuple[float, float]]] = {}
        settings, lowest = sorted(NODE_SETTINGS), sorted(NODE_LOWEST)
        for r in self._query(
                "select name, ts, case when name in (" + ", ".join("?" * len(lowest)) + ") then min(value) "
                "when unit = 'C' then max(value) else sum(value) end as value from metrics where node = ? "
                "and ts >= ? and name like ? and name not in (" + ", ".join("?" * len(settings)) + ") "
                "group by name, ts order by ts", [*lowest, node, since, check + "%", *settings]):
            metrics.setdefault(r["name"], []).append((r["ts"], r["value"]))
        summaries = list(self._query("select day, sweeps, verdicts from summaries where node = ? order by day",
                                       [node]))
        pairs = self._query(
            "select ts, run_id, partner, mode, role, busbw, status, detail from ("
            "select id, ts, run_id, partner, mode, 'node' as role, busbw, status, detail from pairs "
            "where node = ? and ts >= ? union all "
            "select id, ts, run_id, node, mode, 'partner', busbw, status, detail from pairs "
            "where partner = ? and ts >= ?) order by ts desc, id desc limit ?", [node, since, node, since, limit])
        return {"node": node, "sweeps": sweeps, "actions": actions, "metrics": metrics, "pruned_days": summaries,
                "pairs": pairs}

    @_locked
    def knows(self, node: str) -> bool:
        """Whether anything was ever recorded of the node (a sweep, an action, a pruned day's summary)."""
        return any(self.conn.execute(f"select 1 from {table} where node = ? limit 1", [node]).fetchone()
                   for table in ("node_sweeps", "actions", "summaries"))

    @_locked
    def counts(self) -> dict[str, int]:
        return {t: self.conn.execute(f"select count(*) from {t}").fetchone()[0]
                for t in ("runs", "node_sweeps", "checks", "metrics", "actions", "intents", "summaries", "pairs")}

    # -- the Past protocol of the policy ---------------------------------------------------
    @_locked
    def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        rows = self._query(
            "select started, verdict, causes from node_sweeps where node = ? and started >= ? and started <= ? "
            "and finished is not null and dry_run = 0 and kind in ('sweep', 'pair') "
            "and verdict not in ('inconclusive', 'error') order by started", [node, since, until])
        return [{"started": r["started"], "verdict": r["verdict"], "causes": json.loads(r["causes"] or "[]")}
                for r in rows]

    @_locked
    def pair_results(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        """The node's pair results from either side, oldest first: ts, run_id, partner (the other
        node), status, mode, busbw, detail, role (node: it was A or the suspect; partner: it was B
        or the known-good partner) and sweep_id (its own sweep row of that pair run)."""
        return self._query(
            "select ts, run_id, partner, status, mode, busbw, detail, role, sweep_id from ("
            "select id, ts, run_id, partner, status, mode, busbw, detail, 'node' as role, node_sweep_id as sweep_id "
            "from pairs where node = ? and ts >= ? and ts <= ? union all "
            "select id, ts, run_id, node, status, mode, busbw, detail, 'partner', partner_sweep_id "
            "from pairs where partner = ? and ts >= ? and ts <= ?) order by ts, id",
            [node, since, until, node, since, until])

    @_locked
    def series(self, node: str, metric: str, since: float, until: float) -> list[tuple[float, int | None, float]]:
        rows = self.conn.execute("select ts, gpu, value from metrics where node = ? and name = ? and ts >= ? "
                               "and ts <= ? order by ts", [node, metric, since, until]).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    @_locked
    def peer_values(self, profile: str, metric: str, since: float, until: float, exclude: str) -> dict[str, float]:
        """Each other node of the profile: its latest reading of the metric in the window (the
        lowest GPU where the metric is per GPU)."""
        rows = self.conn.execute(
            "select m.node, m.ts, min(m.value) from metrics m join node_sweeps s on s.id = m.sweep_id "
            "where m.name = ? and m.ts >= ? and m.ts <= ? and s.profile = ? and m.node != ? "
            "group by m.node, m.ts order by m.ts", [metric, since, until, profile, exclude]).fetchall()
        latest: dict[str, float] = {}
        for node, _ts, value in rows:
            latest[node] = value
        return latest

    @_locked
    def last_run(self) -> dict[str, Any] | None:
        """The latest run that finished its pass (not a dry run): id, mode and summary."""
        rows = list(self._query("select id, mode, summary from runs where status = 'done' and mode != 'dry-run' "
                                  "order by started desc limit 1"))
        if not rows:
            return None
        return {"id": rows[0]["id"], "mode": rows[0]["mode"], "summary": json.loads(rows[0]["summary"] or "{}")}

    @_locked
    def tool_errors_since(self, since: float) -> dict[str, int]:
        """Node to its sweeps finished since `since` that ended `error` because the check could not
        run at all (a fault of the tool, cause check.tool): they say nothing about the node."""
        rows = self._query("select node, count(*) as n from node_sweeps where finished >= ? and dry_run = 0 "
                             "and kind in ('sweep', 'pair') and verdict = 'error' and causes like '%\"check.tool|%' "
                             "group by node", [since])
        return {r["node"]: r["n"] for r in rows}

    # -- the fleet ---------------------------------------------------------------------------
    @_locked
    def fleet(self) -> list[dict[str, Any]]:
        """Every node's latest conclusive sweep: node, profile, started, verdict, reasons, kind."""
        rows = self._query(
            "select s.* from node_sweeps s join (select node, max(started) as last from node_sweeps "
            "where finished is not null and dry_run = 0 and kind in ('sweep', 'light', 'pair') group by node) l "
            "on s.node = l.node and s.started = l.last order by s.node")
        out = []
        for r in rows:
            r["reasons"] = json.loads(r["reasons"] or "[]")
            r["rules"] = json.loads(r.get("rules") or "[]")
            out.append(r)
        return out

    @_locked
    def verdict_matrix(self, since: float) -> dict[str, list[tuple[float, str]]]:
        """Node to its conclusive sweeps since `since`: (started, verdict), oldest first."""
        out: dict[str, list[tuple[float, str]]] = {}
        for node, started, verdict in self.conn.execute(
                "select node, started, verdict from node_sweeps where started >= ? and finished is not null "
                "and dry_run = 0 and kind in ('sweep', 'light', 'pair') order by started", [since]).fetchall():
            out.setdefault(node, []).append((started, verdict))
        return out

    @_locked
    def sweep_timeline(self, since: float) -> list[dict[str, Any]]:
        """Every conclusive sweep since `since`, oldest first: node, started, verdict, reasons (as JSON
        text: a fleet's worth is read only for the rows drawn), rules, kind."""
        rows = list(self._query(
            "select node, started, verdict, reasons, rules, kind from node_sweeps where started >= ? "
            "and finished is not null and dry_run = 0 and kind in ('sweep', 'light', 'pair') order by started", [since]))
        for r in rows:
            r["rules"] = json.loads(r["rules"]) if r["rules"] and r["rules"] != "[]" else []
        return rows

    @_locked
    def pair_overview(self, since: float, limit: int = 200) -> dict[str, Any]:
        """The fleet's pair runs since `since`, for the report: counts by mode and status; the
        latest failed pairs (with each side's profile); the culprits (suspects whose re-pair
        failed, with the verdict they were held with); and each node that failed pairs, with how
        many different partners (a failed re-pair counts against its suspect only)."""
        counts: dict[str, dict[str, int]] = {}
        for status in (*CONCLUSIVE_PAIRS, "error", "inconclusive"):  # one index range each
            for mode in ("sweep", "repair"):
                n = self.conn.execute("select count(*) from pairs where status = ? and mode = ? and ts >= ?",
                                      [status, mode, since]).fetchone()[0]
                if n:
                    counts.setdefault(mode, {})[status] = n
        failures = self._query(
            "select p.ts, p.run_id, p.node, p.partner, p.mode, p.busbw, p.status, p.detail, s.profile "
            "from pairs p left join node_sweeps s on s.id = p.node_sweep_id "
            "where p.status = 'fail' and p.mode in ('sweep', 'repair') and p.ts >= ? "
            "order by p.ts desc, p.id desc limit ?", [since, limit])
        latest: dict[str, dict[str, Any]] = {}  # the failed re-pairs are few: the latest per node in Python
        for c in self._query("select p.node, p.ts, p.partner, p.busbw, p.detail, s.verdict, s.rules from pairs p "
                             "left join node_sweeps s on s.id = p.node_sweep_id where p.status = 'fail' "
                             "and p.mode = 'repair' and p.ts >= ? order by p.ts, p.id", [since]):
            latest[c["node"]] = c
        culprits = sorted(latest.values(), key=lambda c: -c["ts"])
        for c in culprits:
            c["rules"] = json.loads(c["rules"] or "[]")
        partners = dict(self.conn.execute(
            "select n, count(distinct other) from (select node as n, partner as other from pairs where status = 'fail' "
            "and mode in ('sweep', 'repair') and ts >= ? union all select partner, node from pairs "
            "where status = 'fail' and mode = 'sweep' and ts >= ?) group by n", [since, since]).fetchall())
        return {"counts": counts, "failures": failures, "culprits": culprits, "failed_partners": partners}

    @_locked
    def metric_slopes(self, metric: str, since: float, until: float) -> list[tuple[str, int | None, int, float]]:
        """(node, GPU, readings, least-squares slope per day) of a metric in the window, for every
        node and GPU with two readings or more, computed in SQLite (a fleet's worth of rows never
        reaches Python). Time is in days from `since`, which keeps the sums well conditioned."""
        rows = self.conn.execute(
            "select node, gpu, count(*), sum(x), sum(v), sum(x * x), sum(x * v) from (select node, gpu, "
            "(ts - ?) / 86400.0 as x, value as v from metrics where name = ? and ts >= ? and ts <= ?) "
            "group by node, gpu having count(*) >= 2", [since, metric, since, until]).fetchall()
        out = []
        for node, gpu, n, sx, sv, sxx, sxv in rows:
            den = n * sxx - sx * sx
            out.append((node, gpu, n, (n * sxv - sx * sv) / den if den > 1e-12 else 0.0))
        return out

    @_locked
    def replaced(self) -> dict[str, float]:
        """Node to when Sweeper saw its replacement through (the provider took it away)."""
        return {r[0]: r[1] for r in self.conn.execute(
            "select node, max(ts) from actions where action = 'replaced' and dry_run = 0 group by node").fetchall()}

    @_locked
    def metric_latest(self, metric: str, since: float) -> list[dict[str, Any]]:
        """Each node's latest reading of a metric (lowest over GPUs), with its profile."""
        rows = self.conn.execute(
            "select m.node, s.profile, m.ts, min(m.value) from metrics m join node_sweeps s on s.id = m.sweep_id "
            "where m.name = ? and m.ts >= ? group by m.node, m.ts order by m.ts", [metric, since]).fetchall()
        latest: dict[str, dict[str, Any]] = {}
        for node, profile, ts, value in rows:
            latest[node] = {"node": node, "profile": profile, "ts": ts, "value": value}
        return list(latest.values())

    @_locked
    def dismissals(self) -> list[dict[str, Any]]:
        """Each time a person released a node Sweeper held, oldest first: the node, when Sweeper
        noticed, and the failed checks of the sweep that held it (the findings that node's decisions
        ignore from then on, until the next dismissal)."""
        out = []
        for a in self._query("select node, ts from actions where action = 'false-positive' and dry_run = 0 "
                               "order by ts"):
            held = list(self._query(
                "select id from node_sweeps where node = ? and finished is not null and finished <= ? "
                "and dry_run = 0 and kind in ('sweep', 'pair') order by finished desc limit 1", [a["node"], a["ts"]]))
            findings = list(self._query("select name, code, gpu from checks where sweep_id = ? and status = 'fail'",
                                          [held[0]["id"]])) if held else []
            out.append({"node": a["node"], "ts": a["ts"], "findings": findings})
        # Dismissals made by a sweeper with another history, seen in the cluster by a run of this one.
        for a in self._query("select node, ts, detail from actions where action = 'control-seen' and dry_run = 0 "
                               "and detail like 'dismissed.%' order by ts"):
            try:
                seen = json.loads(a["detail"].split(": ", 1)[1])
            except (IndexError, ValueError):
                continue  # 'cleared', or cut short
            out.append({"node": a["node"], "ts": float(seen.get("at", a["ts"])), "findings": [],
                        "keys": list(seen.get("keys") or [])})
        out.sort(key=lambda d: d["ts"])
        return out

    @_locked
    def replay_rows(self, since: float) -> list[dict[str, Any]]:
        """Every conclusive sweep since `since` with what its policy decided on, oldest first. A
        sweep of a pair carries its pair: pair_status, pair_mode, pair_role, pair_partner, pair_ts
        (None elsewhere); the inconclusive sweeps of a pair that failed (waiting for a re-pair) are
        there too, as a stricter pair rule would have decided them."""
        rows = list(self._query(
            "select s.id, s.node, s.profile, s.started, s.finished, s.decided, s.verdict, s.policy_verdict, s.reasons, "
            "s.causes, s.rules, s.policy, s.kind, coalesce(a.status, b.status) as pair_status, "
            "coalesce(a.mode, b.mode) as pair_mode, case when a.id is not null then 'node' when b.id is not null "
            "then 'partner' end as pair_role, coalesce(a.partner, b.node) as pair_partner, "
            "coalesce(a.ts, b.ts) as pair_ts from node_sweeps s "
            "left join pairs a on s.kind = 'pair' and a.node_sweep_id = s.id "
            "left join pairs b on s.kind = 'pair' and a.id is null and b.partner_sweep_id = s.id "
            "where s.started >= ? and s.finished is not null and s.dry_run = 0 "
            "and s.kind in ('sweep', 'light', 'pair') and (s.verdict != 'inconclusive' "
            "or (coalesce(a.status, b.status) = 'fail' and coalesce(a.mode, b.mode) = 'sweep')) "
            "order by s.started", [since]))
        for r in rows:
            for k in ("reasons", "causes", "rules"):
                r[k] = json.loads(r[k] or "[]")
        return rows

    @_locked
    def sweep_documents(self, sweep_id: int) -> list[dict[str, Any]]:
        """A sweep's recorded results, one document per source, as the policy reads them."""
        docs: dict[str, dict[str, Any]] = {}
        for r in self._query("select source, name, status, severity, gpu, code, message from checks "
                               "where sweep_id = ? order by id", [sweep_id]):
            d = docs.setdefault(r["source"], {"source": r["source"], "checks": [], "metrics": []})
            d["checks"].append({k: r[k] for k in ("name", "status", "severity", "gpu", "code", "message")})
        for r in self._query("select name, gpu, value, unit from metrics where sweep_id = ? order by id",
                               [sweep_id]):
            if docs:
                next(iter(docs.values()))["metrics"].append(dict(r))
        return list(docs.values())

    # -- retention -----------------------------------------------------------------------------
    @_locked
    def prune(self, before: float, dry_run: bool = False) -> dict[str, int]:
        """Delete sweeps (with their checks and metrics), pair results, actions, intents and runs older than
        `before`, keeping one summary row a node a day: sweeps, verdict counts, and per metric
        the min, max and last value."""
        old = [r[0] for r in self.conn.execute("select id from node_sweeps where started < ? and finished is not null",
                                             [before]).fetchall()]
        counts = {"node_sweeps": len(old),
                  "pairs": self.conn.execute("select count(*) from pairs where ts < ?", [before]).fetchone()[0]}
        if not old:
            return {**counts, "checks": 0, "metrics": 0, "summaries": 0}
        marks = "select id from node_sweeps where started < ? and finished is not null"
        counts["checks"] = self.conn.execute(f"select count(*) from checks where sweep_id in ({marks})",
                                           [before]).fetchone()[0]
        counts["metrics"] = self.conn.execute(f"select count(*) from metrics where sweep_id in ({marks})",
                                            [before]).fetchone()[0]
        summaries: dict[tuple[str, str], dict[str, Any]] = {}
        for node, started, verdict in self.conn.execute(
                "select node, started, verdict from node_sweeps where started < ? and finished is not null",
                [before]).fetchall():
            day = time.strftime("%Y-%m-%d", time.gmtime(started))
            s = summaries.setdefault((node, day), {"sweeps": 0, "verdicts": {}, "metrics": {}})
            s["sweeps"] += 1
            s["verdicts"][verdict] = s["verdicts"].get(verdict, 0) + 1
        for node, ts, name, value in self.conn.execute(
                f"select node, ts, name, value from metrics where sweep_id in ({marks}) order by ts", [before]):
            day = time.strftime("%Y-%m-%d", time.gmtime(ts))
            s = summaries.setdefault((node, day), {"sweeps": 0, "verdicts": {}, "metrics": {}})
            m = s["metrics"].setdefault(name, {"min": value, "max": value, "last": value})
            m["min"], m["max"], m["last"] = min(m["min"], value), max(m["max"], value), value
        counts["summaries"] = len(summaries)
        if dry_run:
            return counts
        with self.db.conn:
            for (node, day), s in summaries.items():
                prior = list(self._query("select * from summaries where node = ? and day = ?", [node, day]))
                if prior:  # merge with what an earlier prune kept of the same day
                    p = prior[0]
                    s["sweeps"] += p["sweeps"]
                    for v, n in json.loads(p["verdicts"]).items():
                        s["verdicts"][v] = s["verdicts"].get(v, 0) + n
                    for name, m in json.loads(p["metrics"]).items():
                        cur = s["metrics"].setdefault(name, m)
                        cur["min"], cur["max"] = min(cur["min"], m["min"]), max(cur["max"], m["max"])
                self.db.table("summaries").upsert({"node": node, "day": day, "sweeps": s["sweeps"],
                                                   "verdicts": json.dumps(s["verdicts"]),
                                                   "metrics": json.dumps(s["metrics"])}, pk=("node", "day"))
            self.db.execute(f"delete from checks where sweep_id in ({marks})", [before])
            self.db.execute(f"delete from metrics where sweep_id in ({marks})", [before])
            self.db.execute("delete from node_sweeps where started < ? and finished is not null", [before])
            self.db.execute("delete from actions where ts < ?", [before])
            self.db.execute("delete from pairs where ts < ?", [before])
            self.db.execute("delete from pair_latest where ts < ?", [before])
            self.db.execute("delete from intents where ts < ?", [before])
            self.db.execute("delete from runs where finished is not null and finished < ? and id not in "
                            "(select distinct run_id from node_sweeps)", [before])
        self.db.execute("vacuum")
        return counts
