"""One rolling pass: discover, choose within the budget, hold each node, run its playbook,
decide, hand back or keep held with a reason, and record every step."""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from sweeper import pairing, platforms, profiles, signals
from sweeper.actions import ActionContext, load_all
from sweeper.actions import node as node_actions
from sweeper.actions.decide import policy_for, verdict_of_results
from sweeper.actions.jobs import gpu_stack_words
from sweeper.actions.jobwatch import RunWatch
from sweeper.clock import Clock, WallClock, iso, read_iso
from sweeper.config import Config
from sweeper.control import KEYS, Controls, dismissal_key
from sweeper.errors import Conflict, KubeError, LockLost, NotFound, PlaybookError, Transient
from sweeper.fleet import Gates, NodeView, Plan, gpu_nodes, plan, suspect_signals
from sweeper.kube import Kube
from sweeper.lock import SweepLock
from sweeper.notify import Webhook, message
from sweeper.playbook.executor import Executor, TaskOutcome, load
from sweeper.playbook.model import Playbook
from sweeper.policy import HOLDING, finding_key, pair_rule
from sweeper.remedy import Remediator, Remedy
from sweeper.result import Metric, Result, tool_cause

ATTEMPT_VERDICTS = ("reboot", "replace", "quarantine", "error")


class Recorder(Protocol):
    """What the sweep writes to; the history implements it, a test may use a list."""

    def run_started(self, run_id: str, started: float, mode: str) -> None: ...
    def run_finished(self, run_id: str, finished: float, status: str, taken: int, summary: dict[str, Any]) -> None: ...
    def sweep_started(self, run_id: str, node: str, started: float, playbook: str, profile: str,
                      dry_run: bool = False, kind: str = "sweep") -> int: ...
    def sweep_finished(self, sweep_id: int, finished: float, verdict: str, reasons: list[str],
                       decision: dict[str, Any] | None = None) -> None: ...
    def result(self, sweep_id: int | None, result: Result) -> None: ...
    def action(self, run_id: str, node: str, ts: float, action: str, detail: str, dry_run: bool = False) -> None: ...
    def intent(self, run_id: str, node: str, ts: float, op: str, phase: str, detail: str = "") -> None: ...
    def last_swept(self, kind: str = "sweep") -> dict[str, float]: ...
    def last_light(self) -> dict[str, float]: ...
    def story(self, run_id: str, node: str) -> dict[str, Any]: ...
    def get_control(self, key: str) -> dict[str, Any] | None: ...
    def set_control(self, key: str, value: dict[str, Any] | None, ts: float) -> None: ...
    def failures_since(self, since: float, verdicts: tuple[str, ...]) -> dict[str, int]: ...
    def tool_errors_since(self, since: float) -> dict[str, int]: ...
    def last_run(self) -> dict[str, Any] | None: ...
    def released_by_people(self, nodes: list[str], holding: tuple[str, ...]) -> list[dict[str, Any]]: ...
    def unfinished_runs(self) -> list[str]: ...
    def open_sweeps(self, exclude_run: str) -> list[dict[str, Any]]: ...
    # pair sweeps: one row a pair run, and what the pairing reads
    def pair_result(self, run_id: str, ts: float, node: str, partner: str, status: str, mode: str,
                    busbw: float | None, detail: str,
                    sweep_ids: tuple[int | None, int | None] = (None, None)) -> int: ...
    def known_good(self, since: float) -> set[str]: ...
    def pair_suspects(self, since: float) -> dict[str, str]: ...
    def xids_cleared(self, node: str) -> float | None: ...
    def driver_version(self, node: str) -> str | None: ...
    def pair_results(self, node: str, since: float, until: float) -> list[dict[str, Any]]: ...
    # what the policy's history rules read (policy.Past)
    def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]: ...
    def series(self, node: str, metric: str, since: float, until: float) -> list[tuple[float, int | None, float]]: ...
    def peer_values(self, profile: str, metric: str, since: float, until: float,
                    exclude: str) -> dict[str, float]: ...


RECORDER_WRITES = frozenset({"run_started", "run_finished", "sweep_started", "sweep_finished", "result", "action",
                             "intent", "set_control", "pair_result"})


class FencedRecorder:
    """The history as a run that holds the sweep lock writes to it: each write checks the lock
    first, so that a run that lost it adds nothing to a story another run has taken over."""

    def __init__(self, rec: Recorder, fence: Callable[[], None]) -> None:
        self._rec = rec
        self._fence = fence

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._rec, name)
        if name not in RECORDER_WRITES:
            return attr
        fence = self._fence

        def write(*args: Any, **kwargs: Any) -> Any:
            fence()
            return attr(*args, **kwargs)
        return write


@dataclass
class NodeOutcome:
    node: str
    verdict: str
    reasons: list[str]
    action: str  # released, held, raced, skipped, would-take; suspect (a pair's, held for a re-pair)
    seconds: float = 0.0


@dataclass
class PairRun:
    """What one pair run (or its abandoned hold) left for the rolling queue."""

    outcomes: list[NodeOutcome]
    passed: tuple[str, ...] = ()  # known-good now
    suspects: tuple[tuple[NodeView, str], ...] = ()  # held, waiting for a re-pair: (node, its first partner)
    why: str = ""  # the suspects' failed pair, in words
    back: NodeView | None = None  # a re-pair abandoned before it ran: its suspect waits again
    status: str = ""  # the pair's status (pairing.pair_status), when it ran


@dataclass
class RunReport:
    run_id: str
    started: float
    finished: float
    plan: Plan
    outcomes: list[NodeOutcome] = field(default_factory=list)
    dry_run: bool = False
    api_requests: int = 0
    reconciled: list[dict[str, str]] = field(default_factory=list)
    tool_errors: dict[str, str] = field(default_factory=dict)  # node -> the fault of the check that ended it
    tool_stop: str = ""  # why the run stopped taking nodes: the same fault of the check repeated

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "started": iso(self.started), "finished": iso(self.finished),
            "dry_run": self.dry_run, "gpu_nodes": self.plan.gpu_nodes, "held_before": self.plan.held,
            "budget": self.plan.budget, "api_requests": self.api_requests,
            "nodes": [o.__dict__ for o in self.outcomes], "reconciled": self.reconciled,
            "skipped": [{"node": d.node.name, "reason": d.reason, "detail": d.detail} for d in self.plan.skip],
            "tool_errors": self.tool_errors, "tool_stop": self.tool_stop,
            "gpu_node_profiles": self.plan.profiles,
        }


EVERY_PAIR_FAILED = "every pair of this run failed"


def every_pair_failed(verdicts: dict[frozenset[str], str]) -> list[str]:
    """The failed pairs ("a+b") when every pair of a run failed: at least two distinct pairs (two
    sets of two nodes) failed and none passed, else []. Two nodes that each fail their pair are
    possible; every pair failing is what a broken pair Job (image, transport, template) looks like,
    and it says nothing of the nodes. One failed pair alone is a pair's business: re-pairing names
    its culprit."""
    failed = sorted("+".join(sorted(k)) for k, v in verdicts.items() if v == "fail")
    if len(failed) < 2 or any(v in ("pass", "warn") for v in verdicts.values()):
        return []
    return failed


def new_run_id(now: float) -> str:
    return "sw-" + datetime.fromtimestamp(now, UTC).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class Sweep:
    def __init__(self, kube: Kube, config: Config, recorder: Recorder, clock: Clock | None = None,
                 emit: Callable[[str, dict[str, Any]], None] | None = None, dry_run: bool = False,
                 mode: str = "sweep", controls: Controls | None = None) -> None:
        self.kube = kube
        self.cfg = config
        self.auto_cfg = config  # as configured: each run settles its `auto` keys from the cluster again
        self.rec = recorder
        self.controls = controls or Controls(kube, config.namespace, config.control_name)
        self.clock = clock or WallClock()
        self.emit = emit or (lambda event, data: None)
        self.dry_run = dry_run
        self.mode = mode  # recorded with the run: "sweep", or the schedule of `sweeper serve`
        self.actions = load_all()
        self.stop = threading.Event()
        self.drain = threading.Event()  # take no new node; those under test finish (serve: another schedule's turn)
        self.lock: SweepLock | None = None
        self.jobwatch: RunWatch | None = None  # the running run's watch of its check Jobs
        self._seen: dict[str, dict[str, Any]] = {}  # node -> what its hold read (ActionContext.seen)
        self._replacing = 0  # replace verdicts of this run not yet recorded
        self._lock = threading.Lock()
        self.profiles = profiles.load_profiles(config.path("profiles"))
        self.playbook = load(str(config.playbook_file(config.playbook)), self.actions)
        self.sources = [signals.Source.from_dict(s) for s in config.suspect_sources]  # a bad one fails here
        self.light_playbook = (load(str(config.playbook_file(config.light_playbook)), self.actions)
                               if config.light_playbook else None)
        self.remediator = Remediator(kube, config, self.clock, dry_run=dry_run,
                                     log=lambda m: self.emit("log", {"node": "-", "msg": m}),
                                     cancelled=self.cancelled)
        url = config.webhook()
        self.webhook = Webhook(url, config.webhook_attempts) if url else None
        self.remedies: list[Remedy] = []
        self.failed_checks: dict[str, int] = {}
        self._tool_faults: dict[str, str] = {}  # node -> the fault of the check seen in its results
        self._probe_waits = False  # after a stop, every due node was a suspect: none was tried
        self.tool_errors: dict[str, str] = {}  # node -> that fault, where it ended the node's sweep `error`
        self.tool_stop = ""  # the fault of the check that ended tool_error_limit nodes: take no more
        self.cooling = False  # the last discovery found the breaker's cooldown in force
        self._suspects: dict[str, str] = {}  # node -> why an outside signal names it, as this run first read

    @property
    def kind(self) -> str:
        """What this sweep's rows are: `pair` for a pair playbook, else `sweep`; when a node is due
        is counted within its kind."""
        return "pair" if self.playbook.pair else "sweep"

    # -- discovery ----------------------------------------------------------------
    def discover(self, refill: bool = False) -> Plan:
        """`refill`: a look again within a run, which reuses the outside signals the run's first
        discovery read and marked (one query of each source a run)."""
        nodes = gpu_nodes(self.kube.list_nodes(self.cfg.gpu_node_selector, page_size=self.cfg.page_size), self.cfg)
        pods = self.kube.active_pods(page_size=self.cfg.page_size)
        settled = None if refill else self.resolve_platform(nodes, pods)
        if not self.dry_run:
            self.trip_breaker(len(nodes))
        gates = self.gates()
        self.cooling = gates.cooldown
        if self.cfg.suspect_sources and refill:
            gates = replace(gates, suspects=self._suspects)
        elif self.cfg.suspect_sources:
            found, problems = signals.suspects(self.sources)
            self._suspects = found
            for problem in problems:
                self.emit("log", {"node": "-", "msg": f"suspect source unavailable: {problem}"})
            gates = replace(gates, suspects=found)
            if not self.dry_run:
                nodes = self.mark_suspects(nodes, found)
        p = plan(nodes, pods, self.cfg, self.rec.last_swept(self.kind), self.clock.now(), gates)
        for d in p.skip:
            if d.warning:  # the node's own data is broken: that node is skipped, the run goes on
                self.emit("log", {"node": d.node.name, "msg": f"warning: {d.warning}"})
        # Every GPU node this pass saw, with its profile: the report's coverage counts the never swept.
        p.profiles = {d.node.name: profiles.match(self.profiles, d.node.labels).name for d in p.take + p.skip}
        if settled is not None:
            p.notes = [*settled.why, *p.notes]
        return p

    def resolve_platform(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> platforms.Found | None:
        """Settle `platform: auto` (and the runtime class and DCGM host engine) from the GPU nodes this
        discovery read; the run's checks and remedies use what was found."""
        cfg, found = platforms.resolve(self.auto_cfg, nodes, pods, self.kube.runtime_class_names)
        if found is not None:
            self.cfg = self.remediator.cfg = cfg
            self.emit("log", {"node": "-", "msg": "found " + "; ".join(found.why)})
        return found

    def mark_suspects(self, nodes: list[dict[str, Any]], found: dict[str, str]) -> list[dict[str, Any]]:
        """Label and event each node an outside signal names, once; the nodes as they are after."""
        label, note = f"{self.cfg.prefix}/suspect", f"{self.cfg.prefix}/suspect-reason"
        out = []
        for obj in nodes:
            name = obj["metadata"]["name"]
            if name not in found or (obj["metadata"].get("labels") or {}).get(label) == "true":
                out.append(obj)
                continue
            def mark(n: dict[str, Any], why: str = found[name]) -> list[dict[str, Any]] | None:
                ops = (node_actions.meta_op(n, "labels", {label: "true"}) or []) + \
                    (node_actions.meta_op(n, "annotations", {note: why[:500]}) or [])
                return ops or None

            out.append(node_actions.patch_node(self.kube, name, mark) or obj)
            node_actions.node_event(self.kube, name, obj["metadata"].get("uid", name), "SweeperSuspect",
                                    f"named by an outside signal: {found[name]}", "Warning", "sweeper",
                                    self.clock.now())
            self.rec.action("signals", name, self.clock.now(), "suspect", found[name])
        return out

    def gates(self) -> Gates:
        now = self.clock.now()
        # A switch an older version kept in the history file counts until a run carries it over.
        pause = self.controls.get("pause") or self.rec.get_control("pause")
        breaker = self.controls.get("breaker") or self.rec.get_control("breaker") or {}
        is_open = breaker.get("state") == "open"
        cooling = breaker.get("state") == "closed" and now - float(breaker.get("closed_at", 0)) < self.cfg.breaker_cooldown
        return Gates(paused=(f"paused by {pause.get('by', '?')}: {pause.get('reason', '')}" if pause else ""),
                     breaker=(f"breaker open since {iso(breaker['opened_at'])}: {breaker.get('reason', '')}; "
                              "close it with `sweeper breaker reset`" if is_open else ""),
                     cooldown=cooling, attempts=self._attempts(now))

    def _attempts(self, now: float) -> dict[str, int]:
        """Failed sweeps per node within the attempt window; a check that could not run at all is a
        fault of the tool and does not count against the node."""
        failed = self.rec.failures_since(now - self.cfg.attempt_window, ATTEMPT_VERDICTS)
        tool = self.rec.tool_errors_since(now - self.cfg.attempt_window)
        return {n: k - tool.get(n, 0) for n, k in failed.items() if k > tool.get(n, 0)}

    def trip_breaker(self, gpu_nodes: int) -> bool:
        """Open the breaker when too many nodes failed within the window: a systemic fault (a bad
        driver, a broken check image, a network outage) is not a node fault. It stays open until a
        person resets it."""
        now = self.clock.now()
        current = self.controls.get("breaker") or {}
        if current.get("state") == "open":
            return True
        since = max(now - self.cfg.breaker_window, float(current.get("closed_at", 0.0)))
        failed = self.rec.failures_since(since, HOLDING)
        threshold = max(self.cfg.breaker_failures, math.ceil(gpu_nodes * self.cfg.breaker_percent / 100.0))
        total = sum(failed.values())
        if total < threshold:
            return False
        reason = (f"{total} failing verdicts on {len(failed)} node(s) within {self.cfg.breaker_window / 60:g} min "
                  f"(threshold {threshold})")
        self._switch("breaker", {"state": "open", "opened_at": now, "reason": reason, "nodes": sorted(failed)}, now)
        self.emit("breaker", {"reason": reason})
        return True

    # -- the switches people flip (sweeper.control) ------------------------------------
    def see_controls(self, run_id: str) -> None:
        """Record in the history each switch that changed since this history last saw it, so that
        `sweeper history` and a backtest know when a pause or a breaker was in force; and carry
        over a pause or breaker that an older version kept in the history file."""
        now = self.clock.now()
        for key in KEYS:
            old = self.rec.get_control(key)
            if old is None:
                continue
            ts = float(old.pop("ts", now))
            if self.controls.get(key) is None:
                self.controls.set(key, {**old, "carried_from": "history"}, ts)
                what = f"{key} carried from the history file to configmap {self.cfg.namespace}/{self.cfg.control_name}"
            else:
                what = f"{key} in the history file ignored: configmap {self.cfg.control_name} has its own"
            self.rec.set_control(key, None, now)
            self.rec.action(run_id, "*", now, "control-migrated", f"{what}: {json.dumps(old, sort_keys=True)}"[:1000])
            self.emit("log", {"node": "-", "msg": what})
        switches = self.controls.all()
        for key in sorted(set(KEYS) | set(switches)):
            current = switches.get(key)
            if (self.rec.get_control(f"seen.{key}") or {}).get("value") == current:
                continue
            node = key.removeprefix("dismissed.") if key.startswith("dismissed.") else "*"
            self.rec.action(run_id, node, now, "control-seen",
                            f"{key}: {json.dumps(current, sort_keys=True) if current is not None else 'cleared'}"[:1000])
            self.rec.set_control(f"seen.{key}", {"value": current} if current is not None else None, now)

    def _switch(self, key: str, value: dict[str, Any] | None, now: float) -> None:
        """Flip a switch in the cluster; this history saw it (no control-seen row next run)."""
        self.controls.set(key, value, now)
        current = self.controls.get(key)
        self.rec.set_control(f"seen.{key}", {"value": current} if current is not None else None, now)

    def _dismissal(self, run_id: str, node: str) -> dict[str, Any] | None:
        """The findings a person dismissed on this node; one kept in the history file by an older
        version is carried over to the cluster the first time it is needed."""
        found = self.controls.get(dismissal_key(node))
        if found is not None:
            return found
        old = self.rec.get_control(f"dismissed/{node}")
        if old is None or self.dry_run:
            return old
        now = self.clock.now()
        ts = float(old.pop("ts", now))
        self._switch(dismissal_key(node), old, ts)
        self.rec.set_control(f"dismissed/{node}", None, now)
        self.rec.action(run_id, node, now, "control-migrated",
                        f"dismissal carried from the history file to configmap {self.cfg.control_name}")
        return old

    # -- a run --------------------------------------------------------------------
    def cancelled(self) -> bool:
        """Stopped (SIGTERM), or the sweep lock is no longer this run's."""
        return self.stop.is_set() or (self.lock is not None and not self.lock.holds())

    def fence(self) -> None:
        """Raise LockLost unless this run still holds the sweep lock (a no-op on a dry run)."""
        if self.lock is not None:
            self.lock.fence()

    def run(self) -> RunReport:
        """One pass. While it holds the lock, every write of the run, to the cluster and to the
        history, is fenced by it: a run that lost the lock stops and raises LockLost."""
        self.remediator.preflight()  # a provider that cannot act stops the run before it takes a node
        start = self.clock.now()
        requests_before = self.kube.requests
        run_id = new_run_id(start)
        kube, rec, controls_kube = self.kube, self.rec, self.controls.kube
        if not self.dry_run:
            self.lock = SweepLock(kube, self.cfg.namespace, self.cfg.lock_name, run_id, self.cfg.lock_ttl, self.clock)
            self.lock.acquire()  # LockHeld: another sweep is running
            self.kube = self.remediator.kube = kube.fenced(self.lock.fence)
            self.controls.kube = controls_kube.fenced(self.lock.fence)  # the switches it writes are fenced too
            self.rec = cast(Recorder, FencedRecorder(rec, self.lock.fence))
        # The run's check Jobs and their pods, listed once and then watched, for every run_job of the run.
        self.jobwatch = RunWatch(self.kube, self.cfg.check_namespace, f"{self.cfg.prefix}/run-id={run_id}", self.clock,
                                 self.cfg.poll_interval, log=lambda m: self.emit("log", {"node": "-", "msg": m}))
        try:
            return self._run(run_id, start, requests_before, rec)
        finally:
            self.jobwatch.close()
            self.jobwatch = None
            self._seen.clear()
            self.kube = self.remediator.kube = kube
            self.controls.kube = controls_kube
            self.rec = rec
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    def _run(self, run_id: str, start: float, requests_before: int, own: Recorder) -> RunReport:
        """`own`: the history unfenced, for the run's own row (a fenced run says so there)."""
        self.rec.run_started(run_id, start, "dry-run" if self.dry_run else self.mode)
        self._tool_faults, self.tool_errors, self.tool_stop = {}, {}, ""  # this run's own tally
        self._probe_waits = False  # after a stop, every due node was a suspect: none was tried
        status = "done"
        report = RunReport(run_id, start, start, Plan(), dry_run=self.dry_run)
        try:
            self.controls.refresh()
            if not self.dry_run:
                self.see_controls(run_id)
                report.reconciled = self.reconcile(run_id)
            p = report.plan = self.discover()
            self.emit("plan", {"run_id": run_id, "take": [d.node.name for d in p.take], "gpu_nodes": p.gpu_nodes,
                               "held": p.held, "budget": p.budget,
                               "recheck": [d.node.name for d in p.take if d.reason == "recheck"]})
            if self.dry_run:
                for d in p.take:
                    self.rec.action(run_id, d.node.name, self.clock.now(), "would-sweep", d.detail, dry_run=True)
                    report.outcomes.append(NodeOutcome(d.node.name, "", [d.detail], "would-take"))
            else:
                probe_failed = self._roll(run_id, start, report)
                self.tool_stop = self.tool_stop or self._one_cause(report)
                if report.outcomes:
                    self.trip_breaker(report.plan.gpu_nodes)
                report.tool_errors = dict(self.tool_errors)
                if self.tool_stop:
                    report.tool_stop = self._stop_reason(self.tool_stop, probe_failed)
                    self._announce_stop(run_id, report)
                elif self._probe_waits:  # the stop stands until a node that is not a suspect passes
                    report.tool_stop = self._last_stop()
        except LockLost as exc:
            status = "fenced"
            self.emit("fenced", {"run_id": run_id, "msg": str(exc)})
            raise
        except BaseException:
            status = "failed"
            raise
        finally:
            report.finished = self.clock.now()
            report.api_requests = self.kube.requests - requests_before
            taken = sum(1 for o in report.outcomes if o.action in ("released", "held"))
            own.run_finished(run_id, report.finished, status, taken, report.to_dict())
        return report

    # -- the rolling queue ----------------------------------------------------------------
    def _roll(self, run_id: str, start: float, report: RunReport) -> bool:
        """Keep as many nodes under test as the budget allows until none is due, the run's
        deadline passes or the run is stopped: each time nodes finish, look at the cluster again
        (the same discovery and gates as the first plan: other runs' and people's holds, GPU pods
        waiting, pause, breaker, floor) and give the freed slots to the next due nodes. A node is
        taken at most once per run; light checks ride in the same pool, up to light_max at once.
        True when the probe node (see _probe_first) ended with a fault of the check."""
        if self.playbook.pair:
            return self._roll_pairs(run_id, start, report)
        deadline = start + self.cfg.run_deadline if self.cfg.run_deadline > 0 else math.inf
        p = report.plan
        seen: set[str] = set()  # nodes this run took or light-checked, or is doing so now
        running: dict[Future[NodeOutcome], tuple[str, str]] = {}  # -> (sweep|light, node)
        probe = self._probe_first()
        probe_failed = taken = refill = False  # taken: this run took a node; refill: past the first plan
        last_plan = self.clock.now()
        workers = max(1, self.cfg.max_nodes + self.cfg.light_max)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep") as pool:
            while True:
                sweeping = {n for kind, n in running.values() if kind == "sweep"}
                # A cooldown after a breaker reset takes one node a run; a probe waits for its node.
                if not (self._closed(deadline, refill) or (self.cooling and taken) or (probe and sweeping)):
                    take = self._refill(p, sweeping, seen)
                    if probe:  # the first node after a stop is one with no sign of its own trouble
                        due, take = bool(take), [v for v in take if not self._suspect(v)][:1]
                        self._probe_waits = due and not take
                    lights = sum(1 for kind, _ in running.values() if kind == "light")
                    light = [v for v in self.light_candidates(p) if v.name not in seen]
                    for kind, views in (("sweep", take), ("light", light[: max(0, self.cfg.light_max - lights)])):
                        for v in views:
                            work = self.sweep_node if kind == "sweep" else self.light_check
                            running[pool.submit(work, run_id, v)] = (kind, v.name)
                            seen.add(v.name)
                    taken = taken or bool(take)
                refill = True
                if not running:
                    return probe_failed
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    kind, name = running.pop(f)
                    outcome = f.result()
                    report.outcomes.append(outcome)
                    if probe and kind == "sweep":
                        # The last run stopped on a fault of the check: one node first, the rest if it ran.
                        probe, probe_failed = False, name in self.tool_errors
                        self.tool_stop = self.tool_stop or self.tool_errors.get(name, "")
                if self._closed(deadline, True) or (self.cooling and taken):
                    continue  # no more nodes: only wait for those under test
                p, last_plan = self._look_again(p, bool(running), last_plan)

    def _look_again(self, p: Plan, busy: bool, last_plan: float) -> tuple[Plan, float]:
        """A rolling queue's look at the cluster after nodes finished: the plan (`p` again when the
        cluster could not be read, and the run takes no more nodes) and when the look started.
        Nodes finishing together share one look: at most one per poll_interval while others are
        under test (`busy`). With none left there is nothing to share it with: the run looks at
        once, and ends at once when nothing more is due."""
        if busy:
            self.clock.wait(self.stop, last_plan + self.cfg.poll_interval - self.clock.now())
        started = self.clock.now()
        try:
            self.controls.refresh()
            return self.discover(refill=True), started
        except KubeError as exc:
            self.emit("log", {"node": "-", "msg": f"could not look at the cluster again ({exc}); "
                                                  "taking no more nodes this run"})
            self.drain.set()
            return p, started

    def _closed(self, deadline: float, refill: bool) -> bool:
        """No new node: stopped, lock lost, or the check's own fault repeated; and for a refill (the
        first plan is taken whatever the deadline: it bounds the refills), drained or past the deadline."""
        return self.cancelled() or bool(self.tool_stop) or (
            refill and (self.drain.is_set() or self.clock.now() >= deadline))

    def _refill(self, p: Plan, sweeping: set[str], seen: set[str]) -> list[NodeView]:
        """The due nodes of plan `p` that may be taken now. The plan counted the nodes carrying a
        sweep taint; a node of this run not yet tainted in what it read (being held, or being
        handed back) still counts against the budget, so the budget is never exceeded while
        slots are refilled."""
        listed = {d.node.name: d.node for d in (*p.take, *p.skip)}
        unseen = sum(1 for n in sweeping if n not in listed or not listed[n].sweep_taint(self.cfg.taint_key))
        room = p.budget - unseen
        out = []
        for d in (*p.take, *(d for d in p.skip if d.reason == "over-budget")):
            if d.node.name in seen:
                continue
            if d.reason == "recheck":  # already held (counted), back from its reboot or GPU reset
                out.append(d.node)
            elif room > 0:
                out.append(d.node)
                room -= 1
        return out

    # -- the rolling queue of a pair playbook ------------------------------------------------
    def _roll_pairs(self, run_id: str, start: float, report: RunReport) -> bool:
        """The rolling queue when the playbook has `pair: true`: due nodes are taken two at a time,
        two of one group (profile and `pair_labels`); a pair counts two against the budget, and
        the odd node of a group waits. The suspects of a failed pair stay held while a known-good
        partner is found (this run's passes and the history's within pair_known_good_window), and
        are re-paired before any new pair is taken; one with no partner to come goes back
        `inconclusive`, as does each still waiting when the run ends. A node is taken once a run,
        or again only as a re-pair's suspect or known-good partner. When every pair of the run
        failed (every_pair_failed), no pair is taken and the suspects go back `error`."""
        deadline = start + self.cfg.run_deadline if self.cfg.run_deadline > 0 else math.inf
        p = report.plan
        since = self.clock.now() - self.cfg.pair_known_good_window
        book = pairing.Repairs(known_good=set(self.rec.known_good(since)), earlier=self.rec.pair_suspects(since))
        held: dict[str, NodeView] = {}  # the waiting suspects, as their holds read them
        seen: set[str] = set()
        running: dict[Future[Any], tuple[str, tuple[str, ...], pairing.GroupKey | None]] = {}
        probe = self._probe_first()  # the last run stopped on a fault of the check: one pair first
        verdicts: dict[frozenset[str], str] = {}  # this run's pairs (by their two nodes) -> their last status
        taken = refill = probe_failed = False
        last_plan = self.clock.now()
        workers = max(1, self.cfg.max_nodes + self.cfg.light_max)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep") as pool:
            while True:
                probing = probe and any(kind != "light" for kind, _, _ in running.values())
                doubt = bool(every_pair_failed(verdicts))  # no new pair until those running say otherwise
                if not (self._closed(deadline, refill) or (self.cooling and taken) or probing or doubt):
                    taken = self._start_pairs(run_id, p, book, held, seen, running, pool, report, one=probe) or taken
                    lights = sum(1 for kind, _, _ in running.values() if kind == "light")
                    for v in [v for v in self.light_candidates(p) if v.name not in seen][
                            : max(0, self.cfg.light_max - lights)]:
                        running[pool.submit(self.light_check, run_id, v)] = ("light", (v.name,), None)
                        seen.add(v.name)
                refill = True
                if not running:
                    why = ("the run stopped taking nodes before its re-pair" if self._closed(deadline, True)
                           else "no known-good partner was free this run")
                    every = self.tool_stop.startswith(EVERY_PAIR_FAILED)
                    for name in list(book.waiting):
                        report.outcomes.append(self._let_suspect_go(run_id, book, name, self.tool_stop if every
                                                                    else why, "error" if every else "inconclusive"))
                    return probe_failed
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    kind, names, group = running.pop(f)
                    if kind == "light":
                        report.outcomes.append(f.result())
                        continue
                    got: PairRun = f.result()
                    report.outcomes.extend(got.outcomes)
                    if got.status:
                        verdicts[frozenset(names)] = got.status
                    if probe:  # the probe pair ran: the rest if its check ran, else stop here
                        faults = [self.tool_errors[n] for n in names if n in self.tool_errors]
                        probe, probe_failed = False, bool(faults)
                        self.tool_stop = self.tool_stop or (faults[0] if faults else "")
                    book.passed(*got.passed)
                    for view, first in got.suspects:
                        book.suspect(view.name, first, cast(pairing.GroupKey, group), got.why)
                        held[view.name] = view
                    if kind == "repair" and got.back is not None:
                        book.back(got.back.name)
                        held[got.back.name] = got.back
                    elif kind == "repair":
                        book.settled(names[0])
                failed = every_pair_failed(verdicts)
                if failed and not self.tool_stop and all(kind == "light" for kind, _, _ in running.values()):
                    self.tool_stop = (f"{EVERY_PAIR_FAILED} ({len(failed)} distinct pairs: {', '.join(failed[:4])}; "
                                      "none passed): a fault of the pair check, not of the nodes")
                if self._closed(deadline, True) or (self.cooling and taken):
                    continue
                p, last_plan = self._look_again(p, bool(running), last_plan)

    def partners(self, p: Plan) -> dict[str, str]:
        """For a pair playbook: the pairs a run would take first from plan `p` (each node to its
        partner), two of one group each, within the budget, in the due order."""
        due = [d.node for d in (*p.take, *p.skip) if d.reason in ("idle", "over-budget")]
        out: dict[str, str] = {}
        for a, b in pairing.form_pairs(due, self._group, p.budget):
            out[a.name], out[b.name] = b.name, a.name
        return out

    def _group(self, view: NodeView) -> pairing.GroupKey:
        return pairing.group_key(profiles.match(self.profiles, view.labels).name, view.labels, self.cfg.pair_labels)

    def _start_pairs(self, run_id: str, p: Plan, book: pairing.Repairs, held: dict[str, NodeView], seen: set[str],
                     running: dict[Future[Any], tuple[str, tuple[str, ...], pairing.GroupKey | None]],
                     pool: ThreadPoolExecutor, report: RunReport, one: bool = False) -> bool:
        """Re-pairs first, then new pairs, within the budget (each node held counts one); True
        when a pair was started. `one`: a single pair at most (the probe after a fault of the check)."""
        busy = {n for _, names, _ in running.values() for n in names} | set(book.waiting)
        listed = {d.node.name: d.node for d in (*p.take, *p.skip)}
        room = p.budget - sum(1 for n in busy if n not in listed or not listed[n].sweep_taint(self.cfg.taint_key))
        # Partners: idle nodes, those swept recently first (likely known-good, and not due anyway).
        idle = sorted((d for d in (*p.take, *p.skip) if d.reason in ("idle", "over-budget", "not-due")),
                      key=lambda d: d.reason != "not-due")
        views = {d.node.name: d.node for d in idle}
        keyed = [(d.node.name, self._group(d.node)) for d in idle]
        in_flight = [g for kind, _, g in running.values() if kind == "pair" and g is not None]
        started = False
        for s in list(book.waiting):
            k = book.partner_for(s, keyed, busy)
            if k is None:
                if book.hopeless(s, keyed, in_flight):
                    report.outcomes.append(self._let_suspect_go(run_id, book, s, "no known-good partner"))
                continue
            if room < 1:
                continue
            suspect = book.taken(s, k)
            fut = pool.submit(self.sweep_pair, run_id, held.pop(s), views[k], "repair")
            running[fut] = ("repair", (s, k), suspect.group)
            busy.add(k)
            seen.add(k)
            room -= 1
            started = True
            if one:
                return True
        due = [d.node for d in (*p.take, *p.skip) if d.reason in ("idle", "over-budget")
               and d.node.name not in seen and d.node.name not in busy]
        # A suspect an earlier run let go for want of a known-good partner: re-paired with one now if there is one.
        for v in [v for v in due if v.name in book.earlier]:
            k = pairing.choose_partner(v.name, self._group(v), keyed, book.known_good,
                                       busy | set(book.earlier) | {book.earlier[v.name]})
            if k is None or room < 2:
                continue
            running[pool.submit(self.sweep_pair, run_id, v, views[k], "repair", False)] = (
                "repair", (v.name, k), self._group(v))
            busy.update((v.name, k))
            seen.update((v.name, k))
            room -= 2
            started = True
            if one:
                return True
        due = [v for v in due if v.name not in seen and not (one and self._suspect(v))]
        for a, b in pairing.form_pairs(due, self._group, min(room, 2) if one else room):
            running[pool.submit(self.sweep_pair, run_id, a, b, "sweep")] = ("pair", (a.name, b.name), self._group(a))
            seen.update((a.name, b.name))
            started = True
        return started

    def _let_suspect_go(self, run_id: str, book: pairing.Repairs, name: str, why: str,
                        verdict: str = "inconclusive") -> NodeOutcome:
        """A suspect with no re-pair goes back `inconclusive` (a failed pair is no verdict on either
        node), or `error` when every pair of the run failed (a fault of the check)."""
        s = book.waiting.pop(name)
        reason = f"pair with {s.first_partner} failed ({s.why}); {why}: handed back {verdict}"
        try:
            self.release(run_id, name, reason, owner=run_id)
        except KubeError as exc:
            self.emit("log", {"node": name, "msg": f"could not hand the node back: {exc}; the next run's reconcile "
                                                   "will"})
        self.emit("done", {"node": name, "verdict": verdict, "reasons": [reason], "action": "released"})
        return NodeOutcome(name, verdict, [reason], "released")

    # -- crash recovery -------------------------------------------------------------------
    def reconcile(self, run_id: str) -> list[dict[str, str]]:
        """Finish the story of earlier runs that died: their Jobs are deleted, the nodes they held
        are handed back, or kept held where a failing verdict was already recorded."""
        done: list[dict[str, str]] = []
        now = self.clock.now()
        dead = [old for old in self.rec.unfinished_runs() if old != run_id]
        for old in dead:
            self.rec.run_finished(old, now, "crashed", 0, {"reconciled_by": run_id})
        cut = {(r["run_id"], r["node"]) for r in self.close_open_sweeps(run_id, now) if not r["proven"]}
        # Check Jobs, and the reboot / GPU reset Jobs in their own namespace.
        for ns in dict.fromkeys((self.cfg.check_namespace, self.cfg.remediation_namespace)):
            for job in self.kube.list_jobs(ns, "app.kubernetes.io/managed-by=sweeper"):
                owner = (job["metadata"].get("labels") or {}).get(f"{self.cfg.prefix}/run-id", "")
                if owner != run_id:
                    self.kube.delete_job(ns, job["metadata"]["name"])
                    done.append({"job": job["metadata"]["name"], "action": "deleted", "why": f"left by run {owner}"})
        # A pair sweep's headless Service outlives a run killed between its create and its delete.
        for svc in self.kube.list_services(self.cfg.check_namespace,
                                           "app.kubernetes.io/managed-by=sweeper,app.kubernetes.io/component=pair"):
            owner = (svc["metadata"].get("labels") or {}).get(f"{self.cfg.prefix}/run-id", "")
            if owner != run_id:
                self.kube.delete_service(self.cfg.check_namespace, svc["metadata"]["name"])
                done.append({"service": svc["metadata"]["name"], "action": "deleted", "why": f"left by run {owner}"})
        # And the MPIJob form's MPIJob (deleting it deletes what the MPI Operator made for it); a
        # cluster without the operator does not serve mpijobs at all (kube.NotServed, a NotFound):
        # nothing of the kind to find.
        try:
            mpijobs = self.kube.list_mpijobs(self.cfg.check_namespace, "app.kubernetes.io/managed-by=sweeper")
        except NotFound:
            mpijobs = []
        for mj in mpijobs:
            owner = (mj["metadata"].get("labels") or {}).get(f"{self.cfg.prefix}/run-id", "")
            if owner != run_id:
                self.kube.delete_mpijob(self.cfg.check_namespace, mj["metadata"]["name"])
                done.append({"mpijob": mj["metadata"]["name"], "action": "deleted", "why": f"left by run {owner}"})
        untainted = []
        for obj in self.kube.list_nodes(self.cfg.gpu_node_selector, page_size=self.cfg.page_size):
            view = NodeView.from_obj(obj, self.cfg.gpu_resources)
            taint = view.sweep_taint(self.cfg.taint_key)
            if not taint:
                untainted.append(view.name)
            if not taint or taint.get("value") == run_id:
                continue
            old = str(taint.get("value", ""))
            if old not in dead and f"{self.cfg.prefix}/verdict" in view.annotations:
                continue  # held on purpose by a run that finished: nothing to reconcile
            done.append(self._reconcile_node(run_id, view, old, now, (old, view.name) in cut))
        for s in self.rec.released_by_people(untainted, HOLDING):
            keys = sorted({finding_key(f) for f in s["findings"]})
            self._switch(dismissal_key(s["node"]), {"keys": keys, "verdict": s["verdict"], "sweep": s["id"], "at": now},
                         now)
            self.rec.action(run_id, s["node"], now, "false-positive",
                            f"a person released the node Sweeper held ({s['verdict']}); the same findings will "
                            f"not hold it again: {', '.join(keys)}")
            done.append({"node": s["node"], "action": "marked a false positive",
                         "why": f"released by a person after verdict {s['verdict']}"})
        for d in done:
            if "node" in d:
                self.emit("reconcile", d)
        return done

    def close_open_sweeps(self, run_id: str, now: float) -> list[dict[str, Any]]:
        """Close every sweep row, light checks included, that a dead run left open, tainted node or
        not: with the verdict its intent log proves (the hand-back had begun: `untaint` with
        `verdict V`, or `keep-held V`), else `inconclusive` with the reason."""
        closed = []
        for row in self.rec.open_sweeps(run_id):
            old, proven = row["run_id"], row.get("proven")
            if proven:
                verdict, reasons = str(proven["verdict"]), [
                    f"recorded by reconcile: run {old} reached {proven['verdict']} and began handing the node "
                    "back, then stopped before recording it"]
                at = float(proven["ts"])
            elif row.get("kind") == "light":
                verdict, reasons, at = "inconclusive", [f"run {old} stopped before the light check finished"], now
            else:
                verdict, reasons, at = "inconclusive", [f"run {old} stopped before its checks finished"], now
            self.rec.sweep_finished(row["id"], at, verdict, reasons)
            self.rec.action(run_id, row["node"], now, "reconcile-record", f"{row.get('kind', 'sweep')} of run {old}: "
                            f"{verdict}" + ("" if proven else " (no verdict in its intent log)"))
            closed.append({**row, "verdict": verdict})
        return closed

    def _reconcile_node(self, run_id: str, view: NodeView, old: str, now: float, cut: bool) -> dict[str, str]:
        """`cut`: the dead run's sweep of the node was just closed as inconclusive, with no verdict."""
        name = view.name
        story = self.rec.story(old, name) if old else {"sweep": None, "intents": []}
        sweep = story["sweep"]
        if sweep and sweep["finished"] and sweep["verdict"] in HOLDING:
            reasons = json.loads(sweep["reasons"] or "[]")
            if f"{self.cfg.prefix}/verdict" not in view.annotations:
                node_actions.keep_held(self.kube, self.cfg, name, sweep["verdict"], "; ".join(reasons), old)
            self.rec.action(run_id, name, now, "reconcile-keep-held", f"{sweep['verdict']} recorded by run {old}")
            return {"node": name, "action": "kept held", "why": f"verdict {sweep['verdict']} from run {old}"}
        if sweep or story["intents"]:
            why = (f"run {old} reached {sweep['verdict']} but stopped before handing the node back"
                   if sweep and sweep["finished"] and not cut else f"run {old} stopped before its checks finished")
            self.release(run_id, name, f"reconcile: {why}", owner=old)
            return {"node": name, "action": "released", "why": why}
        since = read_iso(view.annotations.get(f"{self.cfg.prefix}/held-since"))  # unreadable: as if absent
        age = now - since if since is not None else float("inf")
        if age >= self.cfg.orphan_grace:
            why = f"Sweeper's taint from run {old or '?'} with no record in this history, {int(age)}s old"
            self.release(run_id, name, f"reconcile: {why}", owner=old)
            return {"node": name, "action": "released", "why": why}
        return {"node": name, "action": "left held",
                "why": f"taint from run {old} has no record here; released after {int(self.cfg.orphan_grace)}s"}

    # -- faults of the check itself ---------------------------------------------------------
    def _probe_first(self) -> bool:
        return bool(self._last_stop())

    def _last_stop(self) -> str:
        last = self.rec.last_run()
        return str(((last or {}).get("summary") or {}).get("tool_stop") or "")

    def _suspect(self, view: NodeView) -> bool:
        """A node with signs of its own trouble (a condition, a signal, GPUs the device plugin holds
        back): never the probe after a stop, whose failing would say nothing about the check."""
        return bool(suspect_signals(view, self.cfg, self._suspects))

    def _one_cause(self, report: RunReport) -> str:
        """The fault of the check that ended every node this run swept, when there is one: no check
        could run anywhere (a RuntimeClass admission refused, an image that is not there), so the
        run stops as a tool fault however few nodes it took, never a quiet exit 0."""
        swept = [o.node for o in report.outcomes if o.verdict and o.action != "light"]
        causes = {self.tool_errors.get(n, "") for n in swept}
        if self.cfg.tool_error_limit == 0 or not swept or len(causes) != 1:
            return ""
        return causes.pop()

    def _stop_reason(self, cause: str, probe: bool) -> str:
        if cause.startswith(EVERY_PAIR_FAILED):
            return f"run stopped: {cause}. Fix the pair check, then sweep again: the next run tries one pair first"
        if probe:
            return (f"run stopped: the last run stopped on a fault of the check and this run's first node ended "
                    f"with one too ({cause}); no more nodes were taken. Fix the check, then sweep again")
        nodes = sorted(n for n, c in self.tool_errors.items() if c == cause)
        return (f"run stopped: the same fault of the check ended {len(nodes)} nodes ({cause}); no more nodes were "
                f"taken. It says nothing about the nodes ({', '.join(nodes[:5])}{', ...' if len(nodes) > 5 else ''}), "
                "which were handed back. Fix the check, then sweep again: the next run tries one node first")

    def _count_tool_error(self, node: str, verdict: str) -> None:
        """A node whose sweep ended `error` because its check never ran; the same cause on
        tool_error_limit nodes stops the run from taking more."""
        cause = self._tool_faults.get(node, "")
        if verdict != "error" or not cause or gpu_stack_words(cause):
            return  # a cause that names the node's GPU stack (driver, NVML, toolkit, CDI) is the node's
        with self._lock:
            self.tool_errors[node] = cause
            same = sum(1 for c in self.tool_errors.values() if c == cause)
            if self.cfg.tool_error_limit > 0 and same >= self.cfg.tool_error_limit and not self.tool_stop:
                self.tool_stop = cause

    def _announce_stop(self, run_id: str, report: RunReport) -> None:
        """Say why the run stopped: its output, an Event on the lock's Lease, the webhook."""
        why = report.tool_stop
        self.emit("tool-stop", {"reason": why, "nodes": sorted(self.tool_errors)})
        self.rec.action(run_id, "-", self.clock.now(), "tool-stop", why[:1000])
        ts = iso(self.clock.now())
        try:
            self.kube.create_event(self.cfg.namespace, {
                "metadata": {"generateName": f"{self.cfg.lock_name}.", "namespace": self.cfg.namespace},
                "involvedObject": {"kind": "Lease", "namespace": self.cfg.namespace, "name": self.cfg.lock_name,
                                   "apiVersion": "coordination.k8s.io/v1"},
                "reason": "SweepStoppedToolErrors", "message": why[:1024], "type": "Warning",
                "source": {"component": "sweeper"}, "reportingComponent": "sweeper", "reportingInstance": run_id,
                "firstTimestamp": ts, "lastTimestamp": ts, "count": 1})
        except KubeError as exc:
            self.emit("log", {"node": "-", "msg": f"could not record an event: {exc}"})
        if self.webhook:
            _, what = self.webhook.send(message(f"run {run_id}", "stopped", [why], f"{len(self.tool_errors)} tool errors"))
            self.rec.action(run_id, "-", self.clock.now(), "notify", what)

    # -- one node -----------------------------------------------------------------
    def sweep_node(self, run_id: str, view: NodeView) -> NodeOutcome:
        t0 = time.monotonic()
        name = view.name
        profile = profiles.match(self.profiles, view.labels)
        if self.tool_stop:
            return NodeOutcome(name, "", [f"not taken: {self.tool_stop}"], "skipped")
        try:
            node = self.hold(run_id, view)
        except (Conflict, NotFound, Transient) as exc:
            if not self._holds(name, run_id):
                self.emit("skip", {"node": name, "why": str(exc)})
                return NodeOutcome(name, "", [f"could not hold: {exc}"], "skipped")
            node = self._after_hold(run_id, name)  # our taint did land: the reply was lost
        if node is None:
            return NodeOutcome(name, "", ["a GPU pod landed before the taint; released untouched"], "raced")
        sweep_id = self.rec.sweep_started(run_id, name, self.clock.now(), self.playbook.name, profile.name)
        self._event(node, "SweepStarted", f"held by run {run_id} for {self.playbook.name}", "Normal")
        verdict, reasons, done_by_play = "error", ["the playbook did not reach a verdict"], ""
        decision: dict[str, Any] | None = None
        try:
            verdict, reasons, done_by_play, decision = self._play(run_id, sweep_id, node, profile)
            verdict, reasons = self._cap_replacements(verdict, reasons)
        except PlaybookError as exc:
            verdict, reasons = "error", [f"playbook error: {exc}"]
        except KubeError as exc:
            verdict, reasons = "error", [f"cluster error during checks: {exc}"]
        finally:
            action = self.hand_back(run_id, name, verdict, reasons, done_by_play)
            with self._lock:  # a replacement counts once: in this run's tally until recorded, then there
                self.rec.sweep_finished(sweep_id, self.clock.now(), verdict, reasons, decision)
                if verdict == "replace":
                    self._replacing -= 1
            self.emit("done", {"node": name, "verdict": verdict, "reasons": reasons, "action": action})
            self._count_tool_error(name, verdict)
        self.after_verdict(run_id, node, profile, verdict, reasons, decision, action)
        return NodeOutcome(name, verdict, reasons, action, time.monotonic() - t0)

    def observe(self, metrics: Any, report: RunReport, mode: str = "sweep") -> None:
        """Feed a finished run into the Prometheus metrics."""
        gates = self.gates()
        metrics.observe_run(report, mode, api_errors=getattr(self.kube, "errors", 0), breaker_open=bool(gates.breaker),
                            paused=bool(gates.paused), failed_checks=self.failed_checks, remedies=self.remedies,
                            tool_errors=report.tool_errors, tool_stop=bool(report.tool_stop))

    def after_verdict(self, run_id: str, node: NodeView, profile: profiles.Profile, verdict: str, reasons: list[str],
                      decision: dict[str, Any] | None, action: str) -> None:
        """What people and neighbours see of a verdict: the node's status labels, annotation and
        condition, an Event, the remediation, a notification. A failure here is logged; the
        verdict and the hold stand."""
        name = node.name
        rules = list((decision or {}).get("rules") or [])
        seen = self._seen.pop(name, {})
        marked = seen.get("node") if seen.get("marked") == (verdict, tuple(reasons), tuple(map(str, rules))) else None
        try:
            node_actions.mark_status(self.kube, self.cfg, name, verdict, reasons, rules, self.clock.now(),
                                     condition=self.cfg.node_condition, marked=marked)
        except KubeError as exc:
            self.emit("log", {"node": name, "msg": f"could not mark the node's status: {exc}"})
        holding = verdict in HOLDING
        self._event(node, f"Sweep{verdict.capitalize()}", f"verdict {verdict} ({action}): "
                    + ("; ".join(reasons) if verdict != "pass" else "all checks passed"),
                    "Warning" if holding or verdict == "error" else "Normal")
        if not holding or action != "held":
            return
        self.fence()  # a remedy may reach past the Kubernetes API (a cloud provider)
        try:
            remedy = self.remediator.remediate(run_id, node, profile.name, verdict, decision,
                                               self._node_vars(node, profile))
        except (KubeError, PlaybookError) as exc:
            remedy = Remedy("error", "failed", f"remediation failed: {exc}; the node stays held", ok=False)
        if remedy is None:
            return
        with self._lock:
            self.remedies.append(remedy)
        self.rec.action(run_id, name, self.clock.now(), f"remediate-{remedy.provider}",
                        f"{remedy.action}: {remedy.detail}"[:1000], dry_run=remedy.dry_run)
        if remedy.action == "nodeclaim-deleted" and "terminated" in remedy.detail:
            self.rec.action(run_id, name, self.clock.now(), "replaced", f"{remedy.provider}: {remedy.detail}")
        self.emit("remedy", {"node": name, "provider": remedy.provider, "action": remedy.action,
                             "detail": remedy.detail})
        self._event(node, "SweepRemediation", f"{remedy.provider}: {remedy.action}: {remedy.detail}",
                    "Normal" if remedy.ok else "Warning")
        if self.webhook and (verdict == "replace" or remedy.provider not in ("reboot", "gpu-reset")):
            ok_, what = self.webhook.send(message(name, verdict, reasons, f"{remedy.provider}: {remedy.action}"))
            self.rec.action(run_id, name, self.clock.now(), "notify", what)

    def _event(self, node: NodeView, reason: str, msg: str, kind: str) -> None:
        try:
            node_actions.node_event(self.kube, node.name, node.uid or node.name, reason, msg, kind, self.cfg.lock_name,
                                    self.clock.now())
        except KubeError as exc:
            self.emit("log", {"node": node.name, "msg": f"could not record an event: {exc}"})

    @staticmethod
    def _node_vars(node: NodeView, profile: profiles.Profile) -> dict[str, Any]:
        """What playbooks and job templates see as `node`; its profile with the fabric the node advertises."""
        return {"name": node.name, "labels": node.labels, "annotations": node.annotations, "gpus": node.gpus,
                "gpu_resources": node.gpu_vars(), "fabric": dict(node.fabric),
                "profile": profile.on_node(node.fabric, node.labels, node.annotations).as_vars()}

    def _cap_replacements(self, verdict: str, reasons: list[str]) -> tuple[str, list[str]]:
        """Beyond max_replacements_per_hour, a node that should be replaced is held for a person."""
        if verdict != "replace":
            return verdict, reasons
        with self._lock:
            recent = sum(self.rec.failures_since(self.clock.now() - 3600, ("replace",)).values())
            if recent + self._replacing < self.cfg.max_replacements_per_hour:
                self._replacing += 1
                return verdict, reasons
        return "quarantine", reasons + [f"replacement cap reached ({self.cfg.max_replacements_per_hour} per hour): "
                                        "held for a person instead"]

    # -- light checks on busy nodes --------------------------------------------------------
    def light_candidates(self, p: Plan) -> list[NodeView]:
        """Busy nodes due a read-only check (oldest first), when a light playbook is configured."""
        if self.light_playbook is None or self.stop.is_set():
            return []
        last = self.rec.last_light()
        now = self.clock.now()
        due = [d.node for d in p.skip if d.reason == "busy" and now - last.get(d.node.name, 0.0) >= self.cfg.light_interval]
        due.sort(key=lambda v: (last.get(v.name, 0.0), v.name))
        return due[: self.cfg.light_max]

    def light_check(self, run_id: str, view: NodeView) -> NodeOutcome:
        """Run the light playbook on a busy node: no taint, no GPU requested; a failure makes the
        node a suspect (labelled and evented by the playbook), swept first when it goes idle."""
        t0 = time.monotonic()
        assert self.light_playbook is not None
        profile = profiles.match(self.profiles, view.labels)
        sweep_id = self.rec.sweep_started(run_id, view.name, self.clock.now(), self.light_playbook.name,
                                          profile.name, kind="light")
        verdict, reasons = "error", ["the light playbook did not reach a verdict"]
        decision: dict[str, Any] | None = None
        try:
            verdict, reasons, _, decision = self._play(run_id, sweep_id, view, profile, self.light_playbook)
        except (PlaybookError, KubeError) as exc:
            verdict, reasons = "error", [f"light check failed to run: {exc}"]
        finally:
            self.rec.sweep_finished(sweep_id, self.clock.now(), verdict, reasons, decision)
            self.emit("light", {"node": view.name, "verdict": verdict, "reasons": reasons})
        return NodeOutcome(view.name, verdict, reasons, "light", time.monotonic() - t0)

    def _play(self, run_id: str, sweep_id: int, node: NodeView, profile: profiles.Profile,
              playbook: Playbook | None = None) -> tuple[str, list[str], str, dict[str, Any] | None]:
        dismissed = (self._dismissal(run_id, node.name) or {}).get("keys", [])
        node_vars = {**self._node_vars(node, profile), "dismissed": dismissed,
                     "xids_cleared": self.rec.xids_cleared(node.name), "driver_version": self.rec.driver_version(node.name)}
        ctx = ActionContext(
            config=self.cfg, clock=self.clock, kube=self.kube, node=node_vars, run_id=run_id,
            on_result=lambda r: self.rec.result(sweep_id, r),
            intent=lambda op, phase, detail: self.rec.intent(run_id, node.name, self.clock.now(), op, phase, detail),
            log=lambda msg: self.emit("log", {"node": node.name, "msg": msg}),
            cancelled=self.cancelled,
            on_record=lambda kind, data: self._record(run_id, sweep_id, node.name, kind, data), past=self.rec,
            jobwatch=self.jobwatch, seen=self._seen.get(node.name, {}))
        registered: list[Result] = []  # what the play's checks reported: its verdict when no `decide` ran

        def on_result(r: Result) -> None:
            registered.append(r)
            self._on_result(sweep_id, node.name, r)
        ctx.on_result = on_result

        def on_task(o: TaskOutcome) -> None:
            self.emit("task", {"node": node.name, "task": o.name, "status": o.status, "msg": o.msg})

        extra = {"node": node_vars, "run_id": run_id, "check_timeout": self.cfg.check_timeout,
                 "taint_key": self.cfg.taint_key, "prefix": self.cfg.prefix,
                 "default_dcgm_level": self.cfg.dcgm_level_for(node_vars)}
        play = Executor(self.actions, ctx, on_task).run(playbook or self.playbook, extra)
        if play.vars.get("verdict") is None and registered and not play.cancelled:
            play.vars.update(verdict_of_results(ctx, registered))  # no `decide`: the findings' verdict
        verdict, reasons, decision = self._verdict_of(play, "the sweep was stopped before the checks finished")
        return verdict, reasons, str(play.vars.get("handed_back", "")), decision

    @staticmethod
    def _verdict_of(play: Any, stopped: str) -> tuple[str, list[str], dict[str, Any] | None]:
        """The verdict, reasons and decision a finished play left: `inconclusive` when it was
        stopped, `error` when it ended without a verdict (with no `decide` and no result registered)."""
        verdict = play.vars.get("verdict")
        if play.cancelled:
            return "inconclusive", [stopped], None
        if verdict is None:
            return "error", ["the playbook ended without a `decide` task" if not play.failed
                             else "the playbook failed before its verdict"], None
        decision = play.vars.get("decision")
        return str(verdict), [str(r) for r in play.vars.get("reasons", [])], \
            decision if isinstance(decision, dict) else None

    def _on_result(self, sweep_id: int, node: str, r: Result) -> None:
        self.rec.result(sweep_id, r)
        cause = tool_cause([c.to_dict() for c in r.checks])
        with self._lock:
            self.failed_checks[node] = self.failed_checks.get(node, 0) + sum(1 for c in r.checks if c.status == "fail")
            if cause:
                self._tool_faults.setdefault(node, cause)

    def _record(self, run_id: str, sweep_id: int, node: str, kind: str, data: dict[str, Any]) -> None:
        if kind == "metric":
            self.rec.result(sweep_id, Result(node=node, source="playbook", started=self.clock.now(),
                                             finished=self.clock.now(), checks=(), status="pass",
                                             metrics=(Metric(data["name"], float(data["value"]), data["unit"],
                                                             data["gpu"]),)))
        else:
            self.rec.action(run_id, node, self.clock.now(), "note", f"{data['name']}: {data['message']}")

    # -- holding and handing back --------------------------------------------------------
    def hold(self, run_id: str, view: NodeView) -> NodeView | None:
        """Taint the node (conditional on the version we read), then look at its pods again.
        None if a GPU pod got there first, in which case the taint is already gone."""
        name = view.name
        self.rec.intent(run_id, name, self.clock.now(), "taint", "before", view.resource_version)
        updated = node_actions.hold(self.kube, self.cfg, self._raw(view), run_id, self.clock.now())
        self.rec.intent(run_id, name, self.clock.now(), "taint", "after", updated["metadata"]["resourceVersion"])
        return self._after_hold(run_id, name, updated)

    def _holds(self, name: str, run_id: str) -> bool:
        try:
            current = NodeView.from_obj(self.kube.get_node(name), self.cfg.gpu_resources)
        except NotFound:
            return False
        taint = current.sweep_taint(self.cfg.taint_key)
        return bool(taint and taint.get("value") == run_id)

    def _after_hold(self, run_id: str, name: str, updated: dict[str, Any] | None = None) -> NodeView | None:
        """The node carries our taint: record it, then look at its pods again."""
        self.rec.action(run_id, name, self.clock.now(), "hold", f"taint {self.cfg.taint_key}={run_id}:NoSchedule")
        self.emit("hold", {"node": name})
        landed = node_actions.gpu_pods_on(self.kube, self.cfg, name)
        if landed:
            self.emit("raced", {"node": name, "pods": landed})
            self.release(run_id, name, f"GPU pod(s) landed before the taint: {', '.join(landed)}", owner=run_id)
            return None
        node = updated or self.kube.get_node(name)
        # The playbook's first steps (taint, verify_idle) reuse what was just read and written.
        self._seen[name] = {"node": node, "at": self.clock.now(), "idle_at": self.clock.now()}
        return NodeView.from_obj(node, self.cfg.gpu_resources)

    @staticmethod
    def _raw(view: NodeView) -> dict[str, Any]:
        return {"metadata": {"name": view.name, "resourceVersion": view.resource_version,
                             "annotations": view.annotations}, "spec": {"taints": list(view.taints)}}

    def hand_back(self, run_id: str, name: str, verdict: str, reasons: list[str], done_by_play: str = "") -> str:
        """Record what the playbook's `always` did; do it here if the playbook did not."""
        reason = "; ".join(reasons)
        holding = verdict in HOLDING
        left = done_by_play == "left"
        if not left and (done_by_play not in ("released", "held") or (done_by_play == "held") != holding):
            if holding:
                self.rec.intent(run_id, name, self.clock.now(), "keep-held", "before", verdict)
                left = not node_actions.keep_held(self.kube, self.cfg, name, verdict, reason, run_id,
                                                  known=self._seen.get(name, {}).get("node"))
                self.rec.intent(run_id, name, self.clock.now(), "keep-held", "left" if left else "after", verdict)
            else:
                self.rec.intent(run_id, name, self.clock.now(), "untaint", "before", f"verdict {verdict}")
                done = node_actions.release(self.kube, self.cfg, name, run_id, clear_suspect=verdict in ("pass", "warn"),
                                            known=self._seen.get(name, {}).get("node"))
                left = bool(done.left_to)
                self.rec.intent(run_id, name, self.clock.now(), "untaint", "left" if left else "after",
                                f"taint of run {done.left_to}" if left else f"verdict {verdict}")
        if left:
            self.rec.action(run_id, name, self.clock.now(), "left", f"{verdict}: another run's taint is on the "
                            "node; left in place")
            return "left"
        if holding:
            self.rec.action(run_id, name, self.clock.now(), "keep-held", f"{verdict}: {reason[:1000]}")
            return "held"
        self.rec.action(run_id, name, self.clock.now(), "release", f"verdict {verdict}")
        return "released"

    def release(self, run_id: str, name: str, why: str, owner: str) -> bool:
        """Take run `owner`'s taint off (this run's, or a dead run's being reconciled); False when
        another run's taint is there instead, which stays."""
        self.rec.intent(run_id, name, self.clock.now(), "untaint", "before", why)
        done = node_actions.release(self.kube, self.cfg, name, owner)
        if done.left_to:
            self.rec.intent(run_id, name, self.clock.now(), "untaint", "left", f"taint of run {done.left_to}")
            self.rec.action(run_id, name, self.clock.now(), "left", f"{why}; but the node carries the taint of run "
                            f"{done.left_to} now: left in place")
            return False
        self.rec.intent(run_id, name, self.clock.now(), "untaint", "after", why)
        self.rec.action(run_id, name, self.clock.now(), "release", why)
        return True

    # -- one pair -----------------------------------------------------------------
    def _hold_one(self, run_id: str, view: NodeView) -> tuple[NodeView | None, NodeOutcome | None]:
        """Hold a node as sweep_node does; (None, why not) when it could not be held or was raced."""
        try:
            node = self.hold(run_id, view)
        except (Conflict, NotFound, Transient) as exc:
            if not self._holds(view.name, run_id):
                self.emit("skip", {"node": view.name, "why": str(exc)})
                return None, NodeOutcome(view.name, "", [f"could not hold: {exc}"], "skipped")
            node = self._after_hold(run_id, view.name)
        if node is None:
            return None, NodeOutcome(view.name, "", ["a GPU pod landed before the taint; released untouched"], "raced")
        return node, None

    def sweep_pair(self, run_id: str, a: NodeView, b: NodeView, mode: str, held: bool | None = None) -> PairRun:
        """Hold both nodes (in mode "repair", `a` is the suspect, already held by this run unless
        `held` is False: a suspect an earlier run let go), run the pair playbook once for the two,
        record one sweep row per node and one pair result, and hand both back, or keep a suspect
        held for its re-pair, or a culprit with its verdict."""
        t0 = time.monotonic()
        held = mode == "repair" if held is None else held
        back = a if held else None  # a re-pair abandoned before it ran: the suspect waits again
        if self.tool_stop:
            return PairRun([NodeOutcome(v.name, "", [f"not taken: {self.tool_stop}"], "skipped")
                            for v in ((b,) if held else (a, b))], back=back)
        nodes: list[NodeView] = [a] if held else []
        for v in ([b] if held else [a, b]):
            got, lost = self._hold_one(run_id, v)
            if got is not None:
                nodes.append(got)
                continue
            # The pair is abandoned cleanly: what this pair held goes back untouched.
            outs = [cast(NodeOutcome, lost)]
            for other in (a, b):
                if other.name == v.name or (held and other.name == a.name):
                    continue
                why = f"partner {v.name} could not be held ({lost.action if lost else 'lost'}): not swept"
                if any(n.name == other.name for n in nodes):
                    self.release(run_id, other.name, why, owner=run_id)
                outs.append(NodeOutcome(other.name, "", [why], "skipped"))
            return PairRun(outs, back=back)
        first, second = nodes
        self.emit("pair", {"nodes": [first.name, second.name], "mode": mode})
        profs = [profiles.match(self.profiles, n.labels) for n in nodes]
        ids = tuple(self.rec.sweep_started(run_id, n.name, self.clock.now(), self.playbook.name, pr.name, kind="pair")
                    for n, pr in zip(nodes, profs, strict=True))
        for n, other in ((first, second), (second, first)):
            self._event(n, "SweepStarted", f"held by run {run_id} for {self.playbook.name} with {other.name} ({mode})",
                        "Normal")
        verdict, reasons = "error", ["the pair playbook did not reach a verdict"]
        busbw: float | None = None
        decision: dict[str, Any] | None = None
        out = PairRun([])
        try:
            verdict, reasons, busbw, decision = self._play_pair(run_id, (ids[0], ids[1]), first, second, profs, mode)
        except PlaybookError as exc:
            verdict, reasons = "error", [f"playbook error: {exc}"]
        except KubeError as exc:
            verdict, reasons = "error", [f"cluster error during checks: {exc}"]
        finally:
            status = pairing.pair_status(verdict)
            self.rec.pair_result(run_id, self.clock.now(), first.name, second.name, status, mode, busbw,
                                 "; ".join(reasons)[:1000], (ids[0], ids[1]))
            calls = tuple(self._pair_rule(c) for c in pairing.node_verdicts(mode, first.name, second.name, verdict,
                                                                              reasons))
            out.suspects = tuple((n, o.name) for c, n, o in zip(calls, nodes, nodes[::-1], strict=True) if c.suspect)
            out.why = f"{status}: {'; '.join(reasons)}"[:500]
            out.status = status
            if status in ("pass", "warn"):
                out.passed = (first.name, second.name)
            for call, view, prof, sweep_id in zip(calls, nodes, profs, ids, strict=True):
                out.outcomes.append(self._pair_node(run_id, call, view, prof, sweep_id,
                                                    self._pair_decision(call, verdict, decision), t0))
        return out

    def _pair_rule(self, call: pairing.NodeCall) -> pairing.NodeCall:
        """A suspect that the policy's pair rules already condemn (failed pairs with too many
        different partners) gets that verdict now, without a re-pair."""
        if not call.suspect:
            return call
        found = pair_rule(policy_for(ActionContext(config=self.cfg)), self.rec, call.node, self.clock.now())
        if found is None or found.verdict not in HOLDING:
            return call
        return pairing.NodeCall(call.node, found.verdict, found.reasons, rules=found.rules)

    def _pair_decision(self, call: pairing.NodeCall, verdict: str,
                       decision: dict[str, Any] | None) -> dict[str, Any] | None:
        """The decision recorded on a node's row: the play's where the node got the play's verdict;
        the pair rule's where that rule held the node (so its history names the rule)."""
        if call.rules:
            return {"verdict": call.verdict, "causes": [], "rules": list(call.rules), "decided": self.clock.now(),
                    "policy": policy_for(ActionContext(config=self.cfg)).name, "gpus": []}
        return decision if call.verdict == verdict else None

    def _pair_node(self, run_id: str, call: pairing.NodeCall, view: NodeView, prof: profiles.Profile,
                   sweep_id: int, decision: dict[str, Any] | None, t0: float) -> NodeOutcome:
        """One node's part of a pair run: its sweep row closed, and the node handed back, kept held
        with its verdict, or (a suspect) kept held for its re-pair."""
        name, verdict, reasons = view.name, call.verdict, list(call.reasons)
        if call.suspect:
            self.rec.sweep_finished(sweep_id, self.clock.now(), verdict, reasons, decision)
            self.emit("done", {"node": name, "verdict": verdict, "reasons": reasons, "action": "suspect"})
            return NodeOutcome(name, verdict, reasons, "suspect", time.monotonic() - t0)
        verdict, reasons = self._cap_replacements(verdict, reasons)
        action = "left"
        try:
            action = self.hand_back(run_id, name, verdict, reasons)
        finally:
            with self._lock:
                self.rec.sweep_finished(sweep_id, self.clock.now(), verdict, reasons, decision)
                if verdict == "replace":
                    self._replacing -= 1
            self.emit("done", {"node": name, "verdict": verdict, "reasons": reasons, "action": action})
            self._count_tool_error(name, verdict)
        self.after_verdict(run_id, view, prof, verdict, reasons, decision, action)
        return NodeOutcome(name, verdict, reasons, action, time.monotonic() - t0)

    def _play_pair(self, run_id: str, ids: tuple[int, int], a: NodeView, b: NodeView, profs: list[profiles.Profile],
                   mode: str) -> tuple[str, list[str], float | None, dict[str, Any] | None]:
        """Run the pair playbook once: `node` is A, `partner` B, `pair_mode` the mode. Each result
        is recorded on both nodes' sweep rows."""
        dismissed = (self._dismissal(run_id, a.name) or {}).get("keys", [])
        node_vars = {**self._node_vars(a, profs[0]), "dismissed": dismissed,
                     "xids_cleared": self.rec.xids_cleared(a.name), "driver_version": self.rec.driver_version(a.name)}
        partner_vars = self._node_vars(b, profs[1])

        def on_result(r: Result) -> None:
            self._on_result(ids[0], a.name, r)
            self.rec.result(ids[1], replace(r, node=b.name))

        ctx = ActionContext(
            config=self.cfg, clock=self.clock, kube=self.kube, node=node_vars, run_id=run_id, on_result=on_result,
            intent=lambda op, phase, detail: self.rec.intent(run_id, a.name, self.clock.now(), op, phase, detail),
            log=lambda msg: self.emit("log", {"node": a.name, "msg": msg}), cancelled=self.cancelled,
            on_record=lambda kind, data: self._record(run_id, ids[0], a.name, kind, data), past=self.rec,
            jobwatch=self.jobwatch, seen=self._seen.get(a.name, {}), partner=partner_vars)

        def on_task(o: TaskOutcome) -> None:
            self.emit("task", {"node": a.name, "task": o.name, "status": o.status, "msg": o.msg})

        extra = {"node": node_vars, "partner": partner_vars, "pair_mode": mode, "run_id": run_id,
                 "check_timeout": self.cfg.check_timeout, "taint_key": self.cfg.taint_key, "prefix": self.cfg.prefix,
                 "default_dcgm_level": self.cfg.dcgm_level_for(node_vars)}
        play = Executor(self.actions, ctx, on_task).run(self.playbook, extra)
        found = [v["busbw"] for v in play.vars.values() if isinstance(v, dict) and v.get("busbw") is not None]
        verdict, reasons, decision = self._verdict_of(play, "the sweep was stopped before the pair's checks finished")
        return verdict, reasons, float(found[0]) if found else None, decision
