"""The rolling queue: one loop that keeps as many units under test as the budget allows until
none is due, the run's deadline passes or the run is stopped. A unit is a node sweep, a light
check or a pair (a new pair, or a suspect's re-pair); a node playbook fills the queue with node
sweeps (NodeUnits), a pair playbook with pairs (PairUnits), and light checks ride in both. Each
time units finish, the loop looks at the cluster again (the same discovery and gates as the
first plan) and gives the freed slots to the next due nodes."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from sweeper import pairing, profiles
from sweeper.errors import KubeError
from sweeper.fleet import NodeView, Plan
from sweeper.sweep.claims import judge_fabric
from sweeper.sweep.faults import last_stop
from sweeper.sweep.gate import gate_node
from sweeper.sweep.gates import discover, light_candidates, suspect
from sweeper.sweep.pair import claim_pair, let_suspect_go, sweep_pair
from sweeper.sweep.record import EVERY_PAIR_FAILED, NodeOutcome, PairRun, RunReport, every_pair_failed
from sweeper.sweep.state import Run
from sweeper.sweep.unit import light_check, sweep_node


@dataclass(frozen=True)
class Unit:
    """One unit under test: its kind (sweep, light, pair, repair), its nodes, and for a pair the
    group (profile and pair_labels) both nodes belong to."""

    kind: str
    names: tuple[str, ...]
    group: pairing.GroupKey | None = None


Running = dict[Future[Any], Unit]
Submit = Callable[..., None]  # (unit, work, *args): start work(run, *args) as that unit


class Units(Protocol):
    """What the loop asks of the node or the pair queue."""

    def doubt(self) -> bool: ...  # take nothing new for now
    def start(self, p: Plan, running: Running, seen: set[str], submit: Submit, one: bool) -> bool: ...
    def finished(self, unit: Unit, got: Any) -> list[NodeOutcome]: ...
    def after(self, running: Running) -> None: ...  # once the units that finished together are read
    def end(self) -> list[NodeOutcome]: ...  # nothing runs and nothing more is taken


def roll(run: Run, report: RunReport) -> bool:
    """Roll the queue from the run's first plan (report.plan) until it empties. A node is taken at
    most once per run (a pair's node again only as a re-pair's suspect or known-good partner);
    light checks ride in the same pool, up to light_max at once. When the last run stopped on a
    fault of the check, one unit goes first (the probe), and the rest only if its check ran.
    True when the probe ended with a fault of the check."""
    cfg = run.cfg
    deadline = run.start + cfg.run_deadline if cfg.run_deadline > 0 else math.inf
    units: Units = PairUnits(run, report, deadline) if run.sweep.playbook.pair else NodeUnits(run)
    p = report.plan
    seen: set[str] = set()  # nodes this run took or light-checked, or is doing so now
    running: Running = {}
    probe = bool(last_stop(run))
    probe_failed = taken = refill = False  # taken: this run took a node; refill: past the first plan
    last_plan = run.clock.now()
    workers = max(1, cfg.max_nodes + cfg.light_max + cfg.gate_max_nodes)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sweep") as pool:
        def submit(unit: Unit, work: Callable[..., Any], *args: Any) -> None:
            running[pool.submit(work, run, *args)] = unit

        while True:
            probing = probe and any(u.kind != "light" for u in running.values())  # a probe waits for its unit
            # A cooldown after a breaker reset takes one node a run.
            if not (closed(run, deadline, refill) or (run.cooling and taken) or probing or units.doubt()):
                taken = units.start(p, running, seen, submit, probe) or taken
                lights = sum(1 for u in running.values() if u.kind == "light")
                for v in [v for v in light_candidates(run, p) if v.name not in seen][
                        : max(0, cfg.light_max - lights)]:
                    submit(Unit("light", (v.name,)), light_check, v)
                    seen.add(v.name)
            if not closed(run, deadline, refill):
                start_gated(run, p, running, seen, submit, probe)
            refill = True
            if not running:
                report.outcomes.extend(units.end())
                return probe_failed
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                unit = running.pop(f)
                if unit.kind == "light":
                    report.outcomes.append(f.result())
                    continue
                report.outcomes.extend([f.result()] if unit.kind == "gate" else units.finished(unit, f.result()))
                if probe:  # the probe ran: the rest if its check ran, else stop here
                    faults = [run.tool_errors[n] for n in unit.names if n in run.tool_errors]
                    probe, probe_failed = False, bool(faults)
                    run.tool_stop = run.tool_stop or (faults[0] if faults else "")
            units.after(running)
            if closed(run, deadline, True) or (run.cooling and taken):
                continue  # no more nodes: only wait for those under test
            p, last_plan = look_again(run, p, bool(running), last_plan)


def start_gated(run: Run, p: Plan, running: Running, seen: set[str], submit: Submit, probe: bool) -> None:
    """The gated nodes plan `p` takes (sweeper.gating), within the gate's own budget (gate_max_nodes,
    never the fleet's). While a probe is due after a fault of the check, one unit at most runs, and
    a gated node may be that probe."""
    if probe and any(u.kind != "light" for u in running.values()):
        return
    free = run.cfg.gate_max_nodes - sum(1 for u in running.values() if u.kind == "gate")
    for d in [d for d in p.gate if d.take and d.node.name not in seen][: min(free, 1) if probe else free]:
        submit(Unit("gate", (d.node.name,)), gate_node, d)
        seen.add(d.node.name)


def look_again(run: Run, p: Plan, busy: bool, last_plan: float) -> tuple[Plan, float]:
    """A rolling queue's look at the cluster after units finished: the plan (`p` again when the
    cluster could not be read, and the run takes no more nodes) and when the look started.
    Units finishing together share one look: at most one per poll_interval while others are
    under test (`busy`). With none left there is nothing to share it with: the run looks at
    once, and ends at once when nothing more is due."""
    if busy:
        run.clock.wait(run.sweep.stop, last_plan + run.cfg.poll_interval - run.clock.now())
    started = run.clock.now()
    try:
        run.sweep.controls.refresh()
        return discover(run, refill=True), started
    except KubeError as exc:
        run.log("-", f"could not look at the cluster again ({exc}); taking no more nodes this run")
        run.sweep.drain.set()
        return p, started


def closed(run: Run, deadline: float, refill: bool) -> bool:
    """No new node: stopped, lock lost, or the check's own fault repeated; and for a refill (the
    first plan is taken whatever the deadline: it bounds the refills), drained or past the deadline."""
    return run.cancelled() or bool(run.tool_stop) or (
        refill and (run.sweep.drain.is_set() or run.clock.now() >= deadline))


def room(run: Run, p: Plan, busy: set[str]) -> int:
    """The budget left: plan `p` counted the nodes carrying a sweep taint; a node of this run not
    yet tainted in what it read (being held, or being handed back) still counts against it, so
    the budget is never exceeded while slots are refilled."""
    listed = {d.node.name: d.node for d in (*p.take, *p.skip)}
    return p.budget - sum(1 for n in busy if n not in listed or not listed[n].sweep_taint(run.cfg.taint_key))


class NodeUnits:
    """The queue of a node playbook: one node a unit, and the pair of a node whose NVLink or fabric
    claim waits for one (sweeper.sweep.claims.judge_node) with an idle known-good partner."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.known_good: set[str] | None = None  # read from the history at the first claim's pair

    def doubt(self) -> bool:
        return False

    def start(self, p: Plan, running: Running, seen: set[str], submit: Submit, one: bool) -> bool:
        """The due nodes of plan `p` that may be taken now, started. `one`: the probe after a
        fault of the check, a node with no sign of its own trouble."""
        self.claim_pairs(p, running, seen, submit)
        take = self.due(p, {n for u in running.values() if u.kind in ("sweep", "pair") for n in u.names}, seen)
        if one:
            due, take = bool(take), [v for v in take if not suspect(self.run, v)][:1]
            self.run.probe_waits = due and not take
        for v in take:
            submit(Unit("sweep", (v.name,)), sweep_node, v)
            seen.add(v.name)
        return bool(take)

    def due(self, p: Plan, sweeping: set[str], seen: set[str]) -> list[NodeView]:
        left = room(self.run, p, sweeping)
        out = []
        for d in (*p.take, *(d for d in p.skip if d.reason == "over-budget")):
            if d.node.name in seen:
                continue
            if d.reason == "recheck":  # already held (counted), back from its reboot or GPU reset
                out.append(d.node)
            elif left > 0:
                out.append(d.node)
                left -= 1
        return out

    def claim_pairs(self, p: Plan, running: Running, seen: set[str], submit: Submit) -> None:
        """Each node whose NVLink or fabric claim waits for a pair, paired with an idle known-good
        partner of its group (two against the budget; it waits for room, or for a partner this run
        is sweeping now); with none to come, or the node no longer idle, the claim is settled
        inconclusive."""
        run = self.run
        pairing_now = {u.names[0] for u in running.values() if u.kind == "pair"}
        # A node's sweep adds it to run.fabric in its worker before the loop takes the unit off
        # `running`; a plan looked at in between may still show it held by that sweep. It waits
        # until the loop has taken its unit off and looked at the cluster again.
        sweeping_now = {n for u in running.values() if u.kind == "sweep" for n in u.names}
        waiting = [n for n in list(run.fabric) if n not in pairing_now and n not in sweeping_now]
        if not waiting:
            return
        if self.known_good is None:
            self.known_good = set(run.rec.known_good(run.clock.now() - run.cfg.pair_known_good_window))
        busy = {n for u in running.values() if u.kind != "light" for n in u.names}
        left = room(run, p, busy)
        listed = {d.node.name: d for d in (*p.take, *p.skip)}
        idle = [d for d in listed.values() if d.reason in ("idle", "over-budget", "not-due")]
        keyed = [(d.node.name, group(run, d.node)) for d in idle]
        for name in waiting:
            d = listed.get(name)
            if d is None or d.reason not in ("idle", "over-budget", "not-due"):
                judge_fabric(run, name, "", f"the node was not idle after its sweep ({d.reason if d else 'gone'})")
                continue
            g = group(run, d.node)
            k = pairing.choose_partner(name, g, keyed, self.known_good, busy | set(run.fabric))
            if k is None:
                # one of this run's units holds a known-good partner now: the claim waits for it
                if not any(n in busy and n != name and group(run, listed[n].node) == g
                           for n in self.known_good if n in listed):
                    judge_fabric(run, name, "", "no known-good partner of its group is idle")
            elif left >= 2:
                submit(Unit("pair", (name, k), group(run, d.node)), claim_pair, d.node, listed[k].node)
                busy.update((name, k))
                seen.update((name, k))
                left -= 2
            elif not busy:  # nothing of this run under test: no room will free up for the pair
                judge_fabric(run, name, "", f"the budget leaves room for {max(left, 0)} node(s), a pair takes two")

    def finished(self, unit: Unit, got: Any) -> list[NodeOutcome]:
        if unit.kind == "pair":
            got = cast(PairRun, got)
            if got.status in ("pass", "warn") and self.known_good is not None:
                self.known_good.update(got.passed)
            if self.known_good is not None:
                self.known_good.discard(got.disputed)
            return list(got.outcomes)
        return [cast(NodeOutcome, got)]

    def after(self, running: Running) -> None:
        pass

    def end(self) -> list[NodeOutcome]:
        for name in list(self.run.fabric):  # the run stopped taking nodes before their pair
            judge_fabric(self.run, name, "", "the run took no more nodes before its pair")
        return []


def group(run: Run, view: NodeView) -> pairing.GroupKey:
    return pairing.group_key(profiles.match(run.sweep.profiles, view.labels).name, view.labels, run.cfg.pair_labels,
                             dra=bool(view.dra.get("devices")))


def partners(run: Run, p: Plan) -> dict[str, str]:
    """For a pair playbook: the pairs a run would take first from plan `p` (each node to its
    partner), two of one group each, within the budget, in the due order."""
    due = [d.node for d in (*p.take, *p.skip) if d.reason in ("idle", "over-budget")]
    out: dict[str, str] = {}
    for a, b in pairing.form_pairs(due, lambda v: group(run, v), p.budget):
        out[a.name], out[b.name] = b.name, a.name
    return out


@dataclass
class PairUnits:
    """The queue of a pair playbook: due nodes are taken two at a time, two of one group; a pair
    counts two against the budget, and the odd node of a group waits. The suspects of a failed
    pair stay held while a known-good partner is found (this run's passes and the history's within
    pair_known_good_window), and are re-paired before any new pair is taken; one with no partner
    to come goes back `inconclusive`, as does each still waiting when the run ends. When every pair
    of the run failed (every_pair_failed), no pair is taken and the suspects go back `error`."""

    run: Run
    report: RunReport
    deadline: float
    book: pairing.Repairs = field(init=False)
    held: dict[str, NodeView] = field(default_factory=dict)  # the waiting suspects, as their holds read them
    verdicts: dict[frozenset[str], str] = field(default_factory=dict)  # this run's pairs -> their last status

    def __post_init__(self) -> None:
        since = self.run.clock.now() - self.run.cfg.pair_known_good_window
        self.book = pairing.Repairs(known_good=set(self.run.rec.known_good(since)),
                                    earlier=self.run.rec.pair_suspects(since))

    def doubt(self) -> bool:
        return bool(every_pair_failed(self.verdicts))  # no new pair until those running say otherwise

    def start(self, p: Plan, running: Running, seen: set[str], submit: Submit, one: bool) -> bool:
        """Re-pairs first, then new pairs, within the budget (each node held counts one); True
        when a pair was started. `one`: a single pair at most (the probe after a fault of the check)."""
        run, book = self.run, self.book
        busy = {n for u in running.values() for n in u.names} | set(book.waiting)
        left = room(run, p, busy)
        # Partners: idle nodes, those swept recently first (likely known-good, and not due anyway).
        idle = sorted((d for d in (*p.take, *p.skip) if d.reason in ("idle", "over-budget", "not-due")),
                      key=lambda d: d.reason != "not-due")
        views = {d.node.name: d.node for d in idle}
        keyed = [(d.node.name, group(run, d.node)) for d in idle]
        # a pair or a re-pair of the group still running may pass, and make known-good partners
        in_flight = [u.group for u in running.values() if u.kind in ("pair", "repair") and u.group is not None]
        started = False
        for s in list(book.waiting):
            k = book.partner_for(s, keyed, busy)
            if k is None:
                if book.hopeless(s, keyed, in_flight):
                    self.report.outcomes.append(let_suspect_go(run, book, s, "no known-good partner"))
                continue
            if left < 1:
                continue
            waiting = book.taken(s, k)
            submit(Unit("repair", (s, k), waiting.group), sweep_pair, self.held.pop(s), views[k], "repair")
            busy.add(k)
            seen.add(k)
            left -= 1
            started = True
            if one:
                return True
        due = [d.node for d in (*p.take, *p.skip) if d.reason in ("idle", "over-budget")
               and d.node.name not in seen and d.node.name not in busy]
        # A suspect an earlier run let go for want of a known-good partner: re-paired with one now if there is one.
        for v in [v for v in due if v.name in book.earlier]:
            k = pairing.choose_partner(v.name, group(run, v), keyed, book.known_good,
                                       busy | set(book.earlier) | {book.earlier[v.name]})
            if k is None or left < 2:
                continue
            submit(Unit("repair", (v.name, k), group(run, v)), sweep_pair, v, views[k], "repair", False)
            busy.update((v.name, k))
            seen.update((v.name, k))
            left -= 2
            started = True
            if one:
                return True
        due = [v for v in due if v.name not in seen and not (one and suspect(run, v))]
        for a, b in pairing.form_pairs(due, lambda v: group(run, v), min(left, 2) if one else left):
            submit(Unit("pair", (a.name, b.name), group(run, a)), sweep_pair, a, b, "sweep")
            seen.update((a.name, b.name))
            started = True
        return started

    def finished(self, unit: Unit, got: Any) -> list[NodeOutcome]:
        """A pair ran (or was abandoned): note its status, its passes, its suspects."""
        got = cast(PairRun, got)
        book = self.book
        if got.status:
            self.verdicts[frozenset(unit.names)] = got.status
        book.passed(*got.passed)
        book.known_good.discard(got.disputed)  # a suspect now (below), or let go: known-good no more
        for view, first in got.suspects:
            book.suspect(view.name, first, cast(pairing.GroupKey, unit.group), got.why)
            self.held[view.name] = view
        if unit.kind == "repair" and got.back is not None:
            book.back(got.back.name)
            self.held[got.back.name] = got.back
        elif unit.kind == "repair":
            book.settled(unit.names[0])
        return got.outcomes

    def after(self, running: Running) -> None:
        """Every pair of the run failed, and none is running that could say otherwise: stop."""
        run = self.run
        failed = every_pair_failed(self.verdicts)
        if failed and not run.tool_stop and all(u.kind == "light" for u in running.values()):
            run.tool_stop = (f"{EVERY_PAIR_FAILED} ({len(failed)} distinct pairs: {', '.join(failed[:4])}; "
                             "none passed): a fault of the pair check, not of the nodes")

    def end(self) -> list[NodeOutcome]:
        """The suspects still waiting go back: `inconclusive`, or `error` when every pair failed."""
        run = self.run
        why = ("the run stopped taking nodes before its re-pair" if closed(run, self.deadline, True)
               else "no known-good partner was free this run")
        every = run.tool_stop.startswith(EVERY_PAIR_FAILED)
        return [let_suspect_go(run, self.book, name, run.tool_stop if every else why,
                               "error" if every else "inconclusive") for name in list(self.book.waiting)]
