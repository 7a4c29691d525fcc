"""The sweep's side of the history: the Recorder protocol's writes (runs, node sweeps, results,
actions, pair results and the intent log, each in a transaction of its own) and what a sweep reads
back to plan and to reconcile: cadences, known-good partners, controls, a dead run's story."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sweeper.history.base import Base
from sweeper.history.schema import CONCLUSIVE_PAIRS, CONCLUSIVE_SWEEP
from sweeper.history.store import locked

if TYPE_CHECKING:
    from sweeper.result import Result

FINISHED = "finished is not null and dry_run = 0"


class Recorder(Base):
    @locked
    def run_started(self, run_id: str, started: float, mode: str) -> None:
        """A run begins; from here on this history reads its own cluster's rows only (a store shared
        by a fleet never lets one cluster's sweep plan from another's)."""
        from socket import gethostname

        self.scope = self.cluster
        self._write("runs", {"id": run_id, "started": started, "finished": None, "status": "running",
                             "mode": mode, "host": gethostname(), "taken": 0, "summary": "{}"})

    @locked
    def run_finished(self, run_id: str, finished: float, status: str, taken: int, summary: dict[str, Any]) -> None:
        self._run("update runs set finished = :f, status = :s, taken = :t, summary = :m where id = :id",
                  {"f": finished, "s": status, "t": taken, "m": json.dumps(summary), "id": run_id})

    @locked
    def sweep_started(self, run_id: str, node: str, started: float, playbook: str, profile: str,
                      dry_run: bool = False, kind: str = "sweep") -> int:
        return self._write("node_sweeps", {
            "run_id": run_id, "node": node, "started": started, "finished": None, "playbook": playbook,
            "profile": profile, "verdict": None, "reasons": "[]", "dry_run": int(dry_run), "kind": kind,
            "causes": "[]", "rules": "[]"})

    @locked
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
        self._keep_latest(sweep_id)

    def _keep_latest(self, sweep_id: int) -> None:
        """node_latest as this sweep leaves it: the node's row becomes this sweep where it is conclusive
        and the latest (by start, then id: a sweep finished late never overwrites a later one), and its
        `swept` moves on where this is a later full sweep. The same upserts on both backends
        (https://www.sqlite.org/lang_upsert.html, https://www.postgresql.org/docs/current/sql-insert.html)."""
        rows = self._rows(f"select * from node_sweeps where id = :id and {CONCLUSIVE_SWEEP}", {"id": sweep_id})
        if not rows:
            return
        s = rows[0]
        full = s["started"] if s["kind"] == "sweep" and s["verdict"] != "inconclusive" else None
        self._run("insert into node_latest (cluster, node, sweep_id, run_id, started, finished, verdict, kind, profile, "
                  "reasons, rules, swept) values (:cluster_, :node, :id, :run_id, :started, :finished, :verdict, :kind, "
                  ":profile, :reasons, :rules, :swept) on conflict (cluster, node) do update set sweep_id = "
                  "excluded.sweep_id, run_id = excluded.run_id, started = excluded.started, finished = excluded.finished, "
                  "verdict = excluded.verdict, kind = excluded.kind, profile = excluded.profile, reasons = "
                  "excluded.reasons, rules = excluded.rules where excluded.started > node_latest.started or "
                  "(excluded.started = node_latest.started and excluded.sweep_id >= node_latest.sweep_id)",
                  {**s, "cluster_": s["cluster"], "swept": full})
        if full is not None:
            self._run("update node_latest set swept = :swept where cluster = :c and node = :node and "
                      "(swept is null or swept < :swept)", {"c": s["cluster"], "node": s["node"], "swept": full})

    @locked
    def result(self, sweep_id: int | None, result: Result) -> None:
        self._insert_many("checks", [
            {"sweep_id": sweep_id, "node": result.node, "ts": result.finished, "source": result.source,
             "name": c.name, "status": c.status, "severity": c.severity, "gpu": c.gpu, "code": c.code,
             "message": c.message} for c in result.checks])
        self._insert_many("metrics", [
            {"sweep_id": sweep_id, "node": result.node, "ts": result.finished, "name": m.name, "gpu": m.gpu,
             "value": m.value, "unit": m.unit} for m in result.metrics])
        if result.facts:
            self._facts(sweep_id, result.node, result.finished, dict(result.facts))

    @locked
    def facts(self, sweep_id: int | None, node: str, ts: float, facts: dict[str, str]) -> None:
        """The node's facts as this sweep found them (its labels, its NVML readings), keyed by the
        sweep's run: only those that differ from the node's latest recorded value (a fleet's facts
        change at a rollout, not every day); a later reading in the same run replaces an earlier one."""
        self._facts(sweep_id, node, ts, facts)

    def _facts(self, sweep_id: int | None, node: str, ts: float, facts: dict[str, str]) -> None:
        from sweeper.result import clean_facts

        run_id = self._scalar("select run_id from node_sweeps where id = :id", {"id": sweep_id}) \
            if sweep_id is not None else None
        known = dict(self._tuples("select key, value from facts where cluster = :c and node = :node order by ts",
                                  {"c": self.cluster, "node": node}))
        for key, value in clean_facts(facts):
            if known.get(key) == value:
                continue
            self._run("insert into facts (cluster, node, run_id, key, value, ts) values (:c, :node, :run, :key, "
                      ":value, :ts) on conflict (cluster, node, run_id, key) do update set value = excluded.value, "
                      "ts = excluded.ts", {"c": self.cluster, "node": node, "run": run_id or "", "key": key,
                                           "value": value, "ts": ts})

    @locked
    def action(self, run_id: str, node: str, ts: float, action: str, detail: str, dry_run: bool = False) -> None:
        self._write("actions", {"run_id": run_id, "node": node, "ts": ts, "action": action, "detail": detail,
                                "dry_run": int(dry_run)})

    @locked
    def intent(self, run_id: str, node: str, ts: float, op: str, phase: str, detail: str = "") -> None:
        self._write("intents", {"run_id": run_id, "node": node, "ts": ts, "op": op, "phase": phase,
                                "detail": detail})

    @locked
    def pair_result(self, run_id: str, ts: float, node: str, partner: str, status: str, mode: str,
                    busbw: float | None, detail: str,
                    sweep_ids: tuple[int | None, int | None] = (None, None)) -> int:
        """One pair run: `node` is A (in a re-pair, the suspect), `partner` B (in a re-pair, the
        known-good partner); `mode` is sweep or repair; `sweep_ids` each side's sweep row."""
        pair_id = self._write("pairs", {"run_id": run_id, "ts": ts, "node": node, "partner": partner,
                                        "status": status, "mode": mode, "busbw": busbw, "detail": detail,
                                        "node_sweep_id": sweep_ids[0], "partner_sweep_id": sweep_ids[1]})
        if status in CONCLUSIVE_PAIRS:
            # An upsert whose update has a WHERE, the same SQL on SQLite and PostgreSQL: a pair written
            # late (an older ts) does not overwrite a later result
            # (https://www.sqlite.org/lang_upsert.html, https://www.postgresql.org/docs/current/sql-insert.html).
            for side, other, role in ((node, partner, "node"), (partner, node, "partner")):
                self._run("insert into pair_latest (cluster, node, ts, pair_id, partner, status, mode, role) values "
                          "(:c, :node, :ts, :pair_id, :partner, :status, :mode, :role) on conflict (cluster, node) "
                          "do update set ts = excluded.ts, pair_id = excluded.pair_id, partner = excluded.partner, "
                          "status = excluded.status, mode = excluded.mode, role = excluded.role "
                          "where excluded.ts >= pair_latest.ts",
                          {"c": self.cluster, "node": side, "ts": ts, "pair_id": pair_id, "partner": other,
                           "status": status, "mode": mode, "role": role})
        return pair_id

    # -- what a sweep reads back ----------------------------------------------------------
    @locked
    def last_swept(self, kind: str = "sweep") -> dict[str, float]:
        """Node to the start of its latest finished, conclusive, non-dry-run sweep of this kind:
        `sweep` (a single-node playbook) or `pair` (a pair playbook). Each has its own cadence, so
        that a daily node sweep never keeps a node from its pair sweep, nor the reverse."""
        return dict(self._tuples(f"select node, max(started) from node_sweeps where {FINISHED} and kind = :kind "
                                 f"and verdict != 'inconclusive'{self._in()} group by node", {"kind": kind}))

    # Each node's latest conclusive pair result, either side, is kept in pair_latest as pairs are
    # written. Pairs that ended error or inconclusive say nothing about the fabric of either node.
    @locked
    def known_good(self, since: float) -> set[str]:
        """Nodes whose latest conclusive pair result since `since` (either side) passed or warned."""
        return {r[0] for r in self._tuples("select node from pair_latest where ts >= :since and status in "
                                           f"('pass', 'warn'){self._in()}", {"since": since})}

    @locked
    def pair_suspects(self, since: float) -> dict[str, str]:
        """Node to the partner of its failed pair, for nodes whose latest conclusive pair result
        since `since` is a failed pair of a sweep (not yet re-paired with a known-good partner)."""
        return dict(self._tuples("select node, partner from pair_latest where ts >= :since and status = 'fail' "
                                 f"and mode = 'sweep'{self._in()}", {"since": since}))

    @locked
    def xids_cleared(self, node: str) -> float | None:
        """When the node last left its XIDs behind: the start of its latest finished, non-dry-run sweep
        that passed or warned, or its latest GPU reset by Sweeper, whichever is later. The kernel log
        keeps an XID until the node reboots; one logged before this time was judged, or reset, already."""
        rows = self._tuples(f"select max(started) from node_sweeps where node = :node and {FINISHED} "
                            f"and kind in ('sweep', 'pair') and verdict in ('pass', 'warn'){self._in()} "
                            "union all select max(ts) from actions where node = :node and dry_run = 0 "
                            f"and action = 'remediate-gpu-reset' and detail like 'gpus-reset:%'{self._in()}",
                            {"node": node})
        times = [float(r[0]) for r in rows if r[0] is not None]
        return max(times) if times else None

    @locked
    def driver_version(self, node: str) -> str | None:
        """The NVIDIA driver version the node's own check last read through NVML (check
        `driver.version`), or None: what picks a DCGM build where the node carries no GFD labels."""
        msg = self._scalar("select message from checks where node = :node and name = 'driver.version' and "
                           f"status = 'pass'{self._in()} order by ts desc, id desc limit 1", {"node": node})
        return str(msg) if msg else None

    @locked
    def last_light(self) -> dict[str, float]:
        """Node to the start of its latest light (read-only, busy-node) check."""
        return dict(self._tuples(f"select node, max(started) from node_sweeps where kind = 'light'{self._in()} "
                                 "group by node"))

    @locked
    def story(self, run_id: str, node: str) -> dict[str, Any]:
        """What a run recorded about a node: its latest sweep and its intents (for reconciling)."""
        p = {"run": run_id, "node": node}
        sweeps = self._rows("select * from node_sweeps where run_id = :run and node = :node order by id desc limit 1", p)
        intents = self._rows("select op, phase, ts, detail from intents where run_id = :run and node = :node "
                             "order by id", p)
        return {"sweep": sweeps[0] if sweeps else None, "intents": intents}

    @locked
    def get_control(self, key: str) -> dict[str, Any] | None:
        rows = self._rows(f"select value, ts from controls where key = :key{self._in()}", {"key": key})
        return {**json.loads(rows[0]["value"]), "ts": rows[0]["ts"]} if rows else None

    @locked
    def set_control(self, key: str, value: dict[str, Any] | None, ts: float) -> None:
        if value is None:
            self._run("delete from controls where cluster = :c and key = :key", {"c": self.cluster, "key": key})
        else:
            self._run("insert into controls (cluster, key, value, ts) values (:c, :key, :value, :ts) on conflict "
                      "(cluster, key) do update set value = excluded.value, ts = excluded.ts",
                      {"c": self.cluster, "key": key, "value": json.dumps(value), "ts": ts})

    @locked
    def failures_since(self, since: float, verdicts: tuple[str, ...]) -> dict[str, int]:
        """Node to the number of its sweeps with one of these verdicts finished since `since`."""
        marks = ", ".join(f":v{i}" for i in range(len(verdicts))) or "null"
        return dict(self._tuples(
            f"select node, count(*) from node_sweeps where finished >= :since and dry_run = 0 and kind in "
            f"('sweep', 'pair') and verdict in ({marks}){self._in()} group by node",
            {"since": since, **{f"v{i}": v for i, v in enumerate(verdicts)}}))

    @locked
    def tool_errors_since(self, since: float) -> dict[str, int]:
        """Node to its sweeps finished since `since` that ended `error` because the check could not
        run at all (a fault of the tool, cause check.tool): they say nothing about the node."""
        return dict(self._tuples(
            "select node, count(*) from node_sweeps where finished >= :since and dry_run = 0 and kind in "
            f"('sweep', 'pair') and verdict = 'error' and causes like :tool{self._in()} group by node",
            {"since": since, "tool": '%"check.tool|%'}))

    @locked
    def released_by_people(self, nodes: list[str], holding: tuple[str, ...]) -> list[dict[str, Any]]:
        """Nodes whose latest sweep held them, with no hand-back by Sweeper since: the given nodes no
        longer carry the taint, so a person released them. Each with the findings of that sweep.

        Sweeper's own hand-backs are read from the intent log: an `untaint` begun by any run after
        the holding verdict (unless that run then found another run's taint and left it) means
        Sweeper, not a person, released the node, even when the run died before recording it."""
        out = []
        for node in nodes:
            last = self._rows(f"select * from node_sweeps where node = :node and {FINISHED} and kind in "
                              f"('sweep', 'pair'){self._in()} order by finished desc limit 1", {"node": node})
            if not last or last[0]["verdict"] not in holding:
                continue
            s, p = last[0], {"node": node, "since": last[0]["finished"]}
            after = self._rows("select 1 from actions where node = :node and ts >= :since and action in "
                               f"('release', 'false-positive'){self._in()} limit 1", p)
            untainted = self._rows(
                "select 1 from intents i where i.node = :node and i.ts >= :since and i.op = 'untaint' "
                f"and i.phase in ('before', 'after'){self._in('i.')} and not exists (select 1 from intents j "
                "where j.run_id = i.run_id and j.node = i.node and j.op = 'untaint' and j.phase = 'left' "
                "and j.id > i.id) limit 1", p)
            if after or untainted:
                continue
            s["findings"] = self._rows("select name, code, gpu from checks where sweep_id = :id and status = 'fail'",
                                       {"id": s["id"]})
            out.append(s)
        return out

    @locked
    def unfinished_runs(self) -> list[str]:
        return [r[0] for r in self._tuples(f"select id from runs where finished is null{self._in()}")]

    @locked
    def open_sweeps(self, exclude_run: str) -> list[dict[str, Any]]:
        """Sweep rows (light checks included) left unfinished by runs other than `exclude_run`,
        each with `proven`: the verdict its run's intent log proves, or None."""
        rows = self._rows("select id, run_id, node, started, kind from node_sweeps where finished is null "
                          f"and run_id != :run{self._in()} order by id", {"run": exclude_run})
        for r in rows:
            r["proven"] = self.proven_verdict(r["run_id"], r["node"])
        return rows

    @locked
    def proven_verdict(self, run_id: str, node: str) -> dict[str, Any] | None:
        """The verdict a run's hand-back of a node proves, from the intent log: the hand-back only
        begins once the verdict is reached (`untaint` with `verdict V`, or `keep-held` V), so
        its first intent is enough. {"verdict", "ts"}, or None. A pair sweep may hold a node again
        within its run (a re-pair's partner): a new hold starts a new story, so only a hand-back
        after the run's latest `taint` of the node counts."""
        proven = None
        for r in self._rows("select op, phase, ts, detail from intents where run_id = :run and node = :node "
                            "and op in ('untaint', 'keep-held', 'taint') order by id", {"run": run_id, "node": node}):
            detail = r["detail"] or ""
            if r["op"] == "taint":
                proven = None
            elif r["op"] == "keep-held" and detail:
                proven = {"verdict": detail, "ts": r["ts"]}
            elif r["op"] == "untaint" and detail.startswith("verdict "):
                proven = {"verdict": detail[len("verdict "):], "ts": r["ts"]}
        return proven

    @locked
    def gate_seen(self, nodes: list[str], since: float) -> dict[str, float]:
        """For each of `nodes`, when runs first saw it at the gate without a break: the start of the
        earliest of the finished runs, newest first back to the last one before `since`, whose plan
        listed it at the gate (the `gate` of runs.summary) with every later one listing it too. A node
        the latest run did not list is absent: first seen now. A run that recorded no gate (a
        summary without the key) neither extends nor breaks a stretch."""
        where = f"status = 'done' and mode != 'dry-run'{self._in()}"
        rows = self._rows(f"select started, summary from runs where {where} and started >= :since "
                          "order by started desc", {"since": since})
        rows += self._rows(f"select started, summary from runs where {where} and started < :since "
                           "order by started desc limit 1", {"since": since})
        out: dict[str, float] = {}
        live = set(nodes)
        for r in rows:
            if not live:
                break
            try:
                gate = json.loads(r["summary"] or "{}").get("gate")
            except (ValueError, AttributeError, RecursionError):
                continue
            if not isinstance(gate, list):
                continue
            listed = {g.get("node") for g in gate if isinstance(g, dict)}
            for n in sorted(live):
                if n in listed:
                    out[n] = float(r["started"])
                else:
                    live.discard(n)
        return out

    @locked
    def last_run(self) -> dict[str, Any] | None:
        """The latest run that finished its pass (not a dry run): id, mode and summary."""
        rows = self._rows(f"select id, mode, summary from runs where status = 'done' and mode != 'dry-run'{self._in()} "
                          "order by started desc limit 1")
        if not rows:
            return None
        return {"id": rows[0]["id"], "mode": rows[0]["mode"], "summary": json.loads(rows[0]["summary"] or "{}")}
