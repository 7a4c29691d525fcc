"""What a run writes and what it hands back: the Recorder it writes to (fenced by the sweep
lock while the run holds it), one outcome per node, a pair run's leftovers, the run's report."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sweeper.clock import iso
from sweeper.fleet import NodeView, Plan
from sweeper.result import Result

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
    def facts(self, sweep_id: int | None, node: str, ts: float, facts: dict[str, str]) -> None: ...
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
    def gate_seen(self, nodes: list[str], since: float) -> dict[str, float]: ...
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
    # the idle spells and depths of test that the depth ladder reads (sweeper.window)
    def idle_seen(self, ts: float, seen: dict[str, tuple[str, bool]]) -> None: ...
    def idle_spells(self, pool: str, since: float, now: float) -> list[tuple[float, float, bool]]: ...
    def last_depth(self, depth: str) -> dict[str, float]: ...
    # outside claims (sweeper.claims): each judgment, and those already settled
    def claim_result(self, run_id: str, sweep_id: int | None, node: str, ts: float, claim: dict[str, Any],
                     outcome: str, evidence: str) -> None: ...
    def claims_settled(self, nodes: list[str]) -> dict[tuple[str, str, str], float]: ...
    # a held node's evidence bundle (its bytes, or where it is stored)
    def keep_evidence(self, run_id: str, node: str, ts: float, bundle: bytes, manifest: dict[str, Any],
                      location: str = "", keep_bytes: int = 0) -> list[tuple[str, str]]: ...
    # what the policy's history rules read (policy.Past)
    def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]: ...
    def series(self, node: str, metric: str, since: float, until: float) -> list[tuple[float, int | None, float]]: ...
    def peer_values(self, profile: str, metric: str, since: float, until: float,
                    exclude: str) -> dict[str, float]: ...


RECORDER_WRITES = frozenset({"run_started", "run_finished", "sweep_started", "sweep_finished", "result", "facts", "action",
                             "intent", "set_control", "pair_result", "idle_seen",
                             "claim_result", "keep_evidence"})


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
    disputed: str = ""  # the known-good partner whose own log alone failed this re-pair: known-good no more


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
            "gate": [{"node": d.node.name, "reason": d.reason, "detail": d.detail} for d in self.plan.gate],
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
