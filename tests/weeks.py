"""Histories built by the simulated fleet over simulated weeks, fast: each sweep runs the node
checks through the simulated kubelet's code path (fake NVML, fake host, kernel log, the
profile's flags) and, on deep sweeps, nccl-tests output from the fault model; the shipped
policy decides with the history as its past, exactly as the `decide` action does in a sweep;
a reboot verdict reboots the simulated node and hands it back, replace and quarantine take it
out of the fleet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.checks import run_node_checks
from sweeper.checks.options import CheckOptions
from sweeper.history import History
from sweeper.parsers import nccl
from sweeper.policy import Policy, decide, load_policy
from sweeper.profiles import Profile, load_profiles, match
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.tools import nccl_output

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400.0


@dataclass
class Event:
    node: str
    day: float
    verdict: str
    rules: list[str]
    reasons: list[str]


@dataclass
class Weeks:
    fleet: dict[str, Any]
    history: History
    policy: Policy = field(default_factory=lambda: load_policy(ROOT / "policies" / "default.yaml"))
    nccl_every: int = 0  # run nccl-tests on every Nth sweep of a node (0: never)
    events: list[Event] = field(default_factory=list)
    out: dict[str, tuple[str, float]] = field(default_factory=dict)  # node -> (verdict, day) taken out

    def __post_init__(self) -> None:
        self.sim = SimCluster(parse_fleet(self.fleet))
        self.profiles = load_profiles(ROOT / "profiles")
        self.count: dict[str, int] = {}
        self._setup: dict[str, tuple[Profile, CheckOptions]] = {}  # node -> its profile and check options

    def setup(self, node: str) -> tuple[Profile, CheckOptions]:
        """The node's profile and the check's options, as a sweep of it would pass them: the same for
        every sweep of the node, so parsed once (an argument parser built a sweep was a tenth of a run)."""
        if node not in self._setup:
            spec = self.sim.specs[node]
            profile = match(self.profiles, {"node.kubernetes.io/instance-type": spec.instance_type})
            self._setup[node] = profile, CheckOptions.from_argv(["--node", node, *profile.check_args()])
        return self._setup[node]

    def run(self, days: int, per_day: int = 1) -> None:
        for step in range(days * per_day):
            now = self.sim.started + step * DAY / per_day + 60.0
            with self.history.batch():  # a step's sweeps in one transaction: a commit each is a disk flush each
                for spec in self.sim.fleet.nodes:
                    if spec.name not in self.out:
                        self.sweep(spec.name, now)

    def sweep(self, node: str, now: float) -> str:
        spec = self.sim.specs[node]
        profile, opts = self.setup(node)
        boot = self.sim._boot(node)
        docs = [run_node_checks(opts, self.sim.fake_nvml(node, now), self.sim.kernel_log(node, now), now=now,
                                uptime=now - boot, host=self.sim.fake_host(node))]
        self.count[node] = self.count.get(node, 0) + 1
        if self.nccl_every and self.count[node] % self.nccl_every == 0:
            code, text = nccl_output(spec, node)
            docs.append(nccl.parse(text, node, now + 120, min_busbw=profile.nccl_busbw_min, exit_code=code))
        run_id = f"weeks-{int(now)}"
        sid = self.history.sweep_started(run_id, node, now, "weeks", profile.name)
        for d in docs:
            self.history.result(sid, d)
        decided = now + 180
        v = decide([d.to_dict() for d in docs], set(), self.policy, node=node, profile=profile.name, now=decided,
                   past=self.history)
        self.history.sweep_finished(sid, decided + 5, v.verdict, list(v.reasons),
                                    {"verdict": v.verdict, "causes": list(v.causes), "rules": list(v.rules),
                                     "decided": decided, "policy": self.policy.name})
        day = (now - self.sim.started) / DAY
        if v.verdict != "pass":
            self.events.append(Event(node, day, v.verdict, list(v.rules), list(v.reasons)))
        if v.verdict == "reboot":
            self.sim.reboot(node, now + 600)
        elif v.verdict in ("replace", "quarantine"):
            self.out[node] = (v.verdict, day)
        return v.verdict


def record_pair(h: History, ts: float, a: str, b: str, status: str, mode: str = "sweep",
                busbw: float | None = 180.0, detail: str = "", run: str = "r1",
                verdicts: tuple[str, str] | None = None, profile: str = "p5.48xlarge") -> int:
    """One pair run as the engine records it: a sweep row a side (kind `pair`, with the pair's
    check as its result), then the pair's row. Each side's verdict: the pair's status where it
    passed, warned or broke, else `inconclusive` (waiting for a re-pair), unless `verdicts` says."""
    from sweeper.result import CheckResult, Metric, Result

    own = {"pass": "pass", "warn": "warn", "error": "error"}.get(status, "inconclusive")
    ids = []
    for n, verdict in zip((a, b), verdicts or (own, own), strict=True):
        sid = h.sweep_started(run, n, ts - 600, "pair-fabric", profile, kind="pair")
        if status in ("pass", "warn", "fail", "error"):
            h.result(sid, Result(n, "nccl-pair", ts - 600, ts - 60, (CheckResult("pair.nccl", status, detail),),
                                 (Metric("nccl.pair_busbw", busbw, "GB/s"),) if busbw is not None else ()))
        h.sweep_finished(sid, ts, verdict, [detail or status], {"verdict": verdict, "decided": ts - 30,
                                                                "policy": "default"})
        ids.append(sid)
    return h.pair_result(run, ts - 60, a, b, status, mode, busbw, detail, (ids[0], ids[1]))
