"""The two kinds of state a sweep keeps: what a Sweep loads once from its config and keeps
across runs (SweepBase), and what belongs to one run and ends with it (Run)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from sweeper import profiles, signals, window
from sweeper.actions import load_all
from sweeper.actions.jobwatch import RunWatch
from sweeper.claims import Catalog, Claim, load_catalog
from sweeper.clock import Clock, WallClock
from sweeper.config import Config
from sweeper.control import Controls
from sweeper.errors import ConfigError
from sweeper.kube import Kube
from sweeper.lock import SweepLock
from sweeper.notify import Webhook
from sweeper.playbook.executor import load
from sweeper.playbook.model import Playbook
from sweeper.remedy import Remediator, Remedy
from sweeper.sweep.record import Recorder


class SweepBase:
    """What a Sweep loads from its config (playbooks, profiles, the remediator, the webhook) and
    what lasts across its runs: the switches that stop or drain it, and the tallies its metrics read."""

    def __init__(self, kube: Kube, config: Config, recorder: Recorder, clock: Clock | None = None,
                 emit: Callable[[str, dict[str, Any]], None] | None = None, dry_run: bool = False,
                 mode: str = "sweep", controls: Controls | None = None) -> None:
        self.kube = kube
        self.cfg = config  # as each run settled its `auto` keys (platforms.resolve)
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
        self.profiles = profiles.load_profiles(config.path("profiles"))
        self.playbook = load(str(config.playbook_file(config.playbook)), self.actions)
        self.sources = [signals.Source.from_dict(s) for s in config.suspect_sources]  # a bad one fails here
        self.rungs = window.ladder(config.depth_ladder)  # light to deep (sweeper.sweep.depth)
        self.rung_books = {r.name: load(str(config.playbook_file(r.playbook)), self.actions) for r in self.rungs}
        # what other tools' conditions and taints claim, and the test of each (a bad catalogue fails here)
        self.claims_catalog: Catalog | None = load_catalog(config.claims_catalog) if config.claims_test else None
        self.claims_pair_playbook = self._claims_pair(config) if self.claims_catalog else None
        sources = self.claims_catalog.sources if self.claims_catalog else {}
        for name in config.claims_clear if self.claims_catalog else ():
            source = sources.get(name)
            if source is None or source.clear == "never":
                raise ConfigError(f"claims_clear: {name}: " + ("no such source in the claims catalogue" if source is None
                                  else "its owner documents no way to clear its claims that Sweeper may take"))
        self.light_playbook = (load(str(config.playbook_file(config.light_playbook)), self.actions)
                               if config.light_playbook else None)
        # The gate's playbooks: a new node's deep sweep, and the soak of a node back from its reboot or reset.
        self.gate_playbook = load(str(config.playbook_file(config.gate_playbook)), self.actions) \
            if config.gate_taint else None
        self.soak_playbook = load(str(config.playbook_file(config.soak_playbook)), self.actions) \
            if config.gate_taint else None
        self.remediator = Remediator(kube, config, self.clock, dry_run=dry_run,
                                     log=lambda m: self.emit("log", {"node": "-", "msg": m}),
                                     cancelled=self.stop.is_set)  # a run puts its own test in while it goes
        url = config.webhook()
        self.webhook = Webhook(url, config.webhook_attempts) if url else None
        self.remedies: list[Remedy] = []  # every run's, for the metrics
        self.failed_checks: dict[str, int] = {}  # node -> failed checks, every run's, for the metrics

    def _claims_pair(self, config: Config) -> Playbook | None:
        """The pair playbook that tests NVLink and fabric claims: the configured one (which must be a
        pair playbook), or under `auto` the first of the schedules' that is one; None for none."""
        name = config.claims_pair_playbook
        if name != "auto":
            book = load(str(config.playbook_file(name)), self.actions) if name else None
            if book is not None and not book.pair:
                raise ConfigError(f"claims_pair_playbook: {name} is not a pair playbook (`pair: true`)")
            return book
        for entry in config.schedules:
            book = load(str(config.playbook_file(str(entry.get("playbook") or config.playbook))), self.actions)
            if book.pair:
                return book
        return None

    @property
    def kind(self) -> str:
        """What this sweep's rows are: `pair` for a pair playbook, else `sweep`; when a node is due
        is counted within its kind."""
        return "pair" if self.playbook.pair else "sweep"


class Run:
    """One run's own state: its id, the cluster and history as it writes to them (fenced by its
    lock), the watch of its check Jobs, what its holds read, and its tallies of replacements and
    of faults of the check. A look at the cluster outside a run (`sweeper plan`) uses one with no
    lock and no id."""

    def __init__(self, sweep: SweepBase, run_id: str, start: float, kube: Kube | None = None,
                 rec: Recorder | None = None, lock: SweepLock | None = None) -> None:
        self.sweep = sweep
        self.id = run_id
        self.start = start
        self.kube = sweep.kube if kube is None else kube
        self.rec = sweep.rec if rec is None else rec
        self.lock = lock
        self.jobwatch: RunWatch | None = None  # the run's watch of its check Jobs
        self.seen: dict[str, dict[str, Any]] = {}  # node -> what its hold read (ActionContext.seen)
        self.replacing = 0  # replace verdicts of this run not yet recorded
        self.mutex = threading.Lock()  # the tallies below, written by the run's worker threads
        self.tool_faults: dict[str, str] = {}  # node -> the fault of the check seen in its results
        self.tool_errors: dict[str, str] = {}  # node -> that fault, where it ended the node's sweep `error`
        self.tool_stop = ""  # the fault of the check that ended tool_error_limit nodes: take no more
        self.probe_waits = False  # after a stop, every due node was a suspect: none was tried
        self.cooling = False  # the last discovery found the breaker's cooldown in force
        self.suspects: dict[str, str] = {}  # node -> why an outside signal names it, as this run first read
        self.windows: dict[str, Any] = {}  # pool -> its idle window, as this run first estimated it
        self.claims: dict[str, list[Claim]] = {}  # node -> its outside claims not yet settled, at the last discovery
        self.claimed: dict[str, str] = {}  # node -> why those claims send it first
        self.checks: dict[str, list[dict[str, Any]]] = {}  # node -> its sweep's checks so far (claims judge them)
        self.boots: dict[str, float] = {}  # node -> when its current boot began, as its check read it
        self.fabric: dict[str, list[tuple[Claim, str, str, int]]] = {}  # node -> NVLink/fabric claims waiting for a pair

    @property
    def cfg(self) -> Config:
        return self.sweep.cfg

    @property
    def clock(self) -> Clock:
        return self.sweep.clock

    @property
    def dry_run(self) -> bool:
        return self.sweep.dry_run

    def emit(self, event: str, data: dict[str, Any]) -> None:
        self.sweep.emit(event, data)

    def log(self, node: str, msg: str) -> None:
        self.sweep.emit("log", {"node": node, "msg": msg})

    def cancelled(self) -> bool:
        """Stopped (SIGTERM), or the sweep lock is no longer this run's."""
        return self.sweep.stop.is_set() or (self.lock is not None and not self.lock.holds())

    def fence(self) -> None:
        """Raise LockLost unless this run still holds the sweep lock (a no-op on a dry run)."""
        if self.lock is not None:
            self.lock.fence()
