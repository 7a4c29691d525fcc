"""Failures read by cohort: the node-days of a fleet grouped by one fact of the nodes (driver, CUDA,
VBIOS, board, DCGM version, zone, rack, instance type...), each cohort's failure rate per node-day
with a 95% Wilson interval, and the cohorts whose rate stands apart from the rest of the fleet.

The statistic, stated once (docs/cohorts.md, `sweeper cohorts --help`):
- a node-day is a node on a UTC day with at least one conclusive sweep (pass, warn or a holding
  verdict; `error` and `inconclusive` say nothing of the node); it failed when a sweep that day
  ended reboot, replace or quarantine. Its cohort is the fact its sweeps recorded that day (else
  the node's latest earlier value); a node-day with none is `(unknown)`, shown but never tested;
- a node counts one failure a cohort: its node-days in a cohort after it failed there are no
  longer at risk and are left out. A bad node failing again and again would otherwise count as
  many independent failures, and a rack that happens to hold three bad nodes would stand apart;
- rate = failed node-days / node-days at risk, with the Wilson score interval;
- test: a one-sided Fisher exact test (the hypergeometric upper tail) of the cohort's failed
  node-days against the rest of the fleet's, for each cohort with at least `min_days` node-days,
  Holm-corrected over the cohorts tested; flagged when the adjusted p is below `alpha`, the cohort
  has at least `min_failures` failed node-days and its rate is above the rest's. alpha is 0.001: a
  stopped rollout costs, and over 160 seeded fleets with no shared bad fact none was flagged."""

from __future__ import annotations

import json
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sweeper.cohort_stats import holm, hypergeom_sf, wilson

HOLDING = ("reboot", "replace", "quarantine")  # sweeper.policy.HOLDING
CONCLUSIVE = ("pass", "warn", *HOLDING)
UNKNOWN = "(unknown)"
DAY = 86400.0
ALPHA, MIN_DAYS, MIN_FAILURES = 0.001, 30, 3

# The cohort keys `--by` names: each a fact key of the history (any other fact key is taken as is).
BY = ("driver", "cuda", "vbios", "board", "dcgm", "zone", "rack", "block", "instance-type", "product")

# Node labels read as facts: the first label present of each list. Topology: EKS's network node
# layers (layer-3 is the closest to the instance:
# https://docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html), GKE's physical
# topology of a reservation (block, sub-block, host:
# https://cloud.google.com/compute/docs/reference/rest/v1/instances, resourceStatus.physicalHostTopology),
# and NVIDIA Topograph's labels for any cloud or on-prem fabric (leaf, spine, accelerator:
# https://docs.nvidia.com/topograph/reference/node-labels-and-annotations). AKS documents no rack or
# network-block label (https://learn.microsoft.com/azure/aks/use-labels): there, Topograph's.
LABEL_FACTS: Mapping[str, tuple[str, ...]] = {
    "instance-type": ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"),
    "zone": ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"),
    "product": ("nvidia.com/gpu.product",),
    "rack": ("topology.k8s.aws/network-node-layer-3", "cloud.google.com/gce-topology-subblock",
             "network.topology.nvidia.com/leaf"),
    "block": ("topology.k8s.aws/network-node-layer-2", "cloud.google.com/gce-topology-block",
              "network.topology.nvidia.com/spine"),
    "spine": ("topology.k8s.aws/network-node-layer-1", "network.topology.nvidia.com/core"),
    "host": ("cloud.google.com/gce-topology-host",),
    "nvlink-domain": ("nvidia.com/gpu.clique", "network.topology.nvidia.com/accelerator"),
}
# GPU feature discovery's driver labels (new names, then the deprecated ones): the driver where no
# NVML reading is recorded; the node's own NVML reading, written after, replaces it.
_GFD_DRIVER = ("nvidia.com/cuda.driver-version.full",)
_GFD_PARTS = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")


def label_facts(labels: Mapping[str, str]) -> dict[str, str]:
    """The facts a node's labels tell (values are someone else's words: sweeper.result.clean_facts caps them)."""
    out = {key: str(labels[hit]) for key, names in LABEL_FACTS.items()
           if (hit := next((n for n in names if labels.get(n)), None))}
    driver = next((labels[n] for n in _GFD_DRIVER if labels.get(n)), None)
    if not driver and all(labels.get(n) for n in _GFD_PARTS[:2]):
        driver = ".".join(labels[n] for n in _GFD_PARTS if labels.get(n))
    if driver:
        out["driver"] = str(driver)
    return out


class NodeDay(NamedTuple):
    node: str
    day: int  # days since the window's start
    cohort: str
    failed: bool
    causes: tuple[str, ...] = ()  # the failing sweeps' causes (check|code)


def node_days(rows: Iterable[Sequence[Any]], since: float) -> list[NodeDay]:
    """Node-days from the history's rows (node, time, verdict, causes JSON, value), oldest first
    (sweeper.history `cohort_rows`)."""
    latest: dict[str, str] = {}
    days: dict[tuple[int, str], list[Any]] = {}  # (day, node) -> [cohort, failed, causes]
    for node, started, verdict, causes, value in rows:
        if value:
            latest[node] = value if isinstance(value, str) else str(value)
        if verdict not in CONCLUSIVE or started < since:
            continue
        key = (int((started - since) // DAY), node)
        d = days.get(key)
        if d is None:
            days[key] = d = [latest.get(node, UNKNOWN), False, ()]
        else:
            d[0] = latest.get(node, UNKNOWN)
        if verdict in HOLDING:
            d[1] = True
            d[2] += tuple(str(c) for c in json.loads(causes or "[]"))
    out, done = [], set()
    make = tuple.__new__  # a NodeDay from its fields in order, without NamedTuple's constructor
    for (day, n), (cohort, failed, why) in sorted(days.items()):  # keys are unique: day, then node
        if (n, cohort) in done:  # failed in this cohort already: no longer at risk of a first failure in it
            continue
        if failed:
            done.add((n, cohort))
        out.append(make(NodeDay, (n, day, cohort, failed, why)))
    return out


def node_days_by(sweeps: Sequence[Sequence[Any]], facts: Sequence[Sequence[Any]], keys: Sequence[str],
                 since: float) -> dict[str, list[NodeDay]]:
    """node_days for each fact of `keys` at once, from the history's rows as stored (sweeper.history
    `cohort_tables`): sweeps (node, started, verdict, causes, id) in (started, id) order, and facts
    (node, key, value, ts, and where its run has a sweep in the window that sweep's started and id)
    in time order. The same node-days as node_days over cohort_rows(key), for every key: the sweeps
    are walked once (a node-day, its failure and causes do not depend on the fact), then each key's
    value is looked up at each node-day's last conclusive sweep, among that node's few changes of it."""
    skeleton: dict[tuple[int, str], list[Any]] = {}  # (day, node) -> [its last conclusive sweep, failed, causes]
    for node, started, verdict, causes, sweep_id in sweeps:
        if verdict not in CONCLUSIVE or started < since:
            continue
        key = (int((started - since) // DAY), node)
        d = skeleton.get(key)
        if d is None:
            skeleton[key] = d = [(started, 1, sweep_id), False, ()]
        else:
            d[0] = (started, 1, sweep_id)
        if verdict in HOLDING:
            d[1] = True
            d[2] += tuple(str(x) for x in json.loads(causes or "[]"))
    ordered = sorted(skeleton.items())
    first: dict[str, tuple[float, int, int]] = {}  # each node's first conclusive node-day's sweep
    for (_day, node), (anchor, _failed, _why) in ordered:
        if node not in first or anchor < first[node]:
            first[node] = anchor
    out: dict[str, list[NodeDay]] = {}
    make = tuple.__new__  # a NodeDay from its fields in order, without NamedTuple's constructor (150,000 a report)
    for fact in keys:
        # each node's values in the order cohort_rows puts them: a fact of a sweep's run at that sweep
        # (each of them), any other at its own time, before a sweep of the same moment
        events: dict[str, list[tuple[tuple[float, int, int], str]]] = {}
        for j, (node, k, value, ts, at_started, at_id) in enumerate(facts):
            if k == fact and value:
                events.setdefault(node, []).append(
                    ((ts, 0, j) if at_id is None else (at_started, 1, at_id), value if isinstance(value, str)
                     else str(value)))
        # a node whose value last changed before its first node-day has that value all through (most do)
        fixed = dict.fromkeys(first, UNKNOWN)
        marks: dict[str, list[tuple[float, int, int]]] = {}
        for node, evs in events.items():
            evs.sort(key=lambda e: e[0])
            if node in first and evs[-1][0] <= first[node]:
                fixed[node] = evs[-1][1]
            elif node in first:
                del fixed[node]
                marks[node] = [e[0] for e in evs]
        days: list[NodeDay] = []
        done: dict[str, set[str]] = {}
        for (day, node), (anchor, failed, why) in ordered:
            cohort = fixed.get(node)
            if cohort is None:
                n = bisect_right(marks[node], anchor)
                cohort = events[node][n - 1][1] if n else UNKNOWN
            gone = done.get(node)
            if gone is not None and cohort in gone:  # failed in this cohort already: no longer at risk in it
                continue
            if failed:
                done.setdefault(node, set()).add(cohort)
            days.append(make(NodeDay, (node, day, cohort, failed, why)))
        out[fact] = days
    return out


@dataclass
class Cohort:
    value: str
    nodes: int
    node_days: int
    failures: int  # failed node-days
    failed_nodes: int
    rate: float
    low: float
    high: float
    tested: bool = False
    p: float = 1.0  # one-sided Fisher exact, cohort vs the rest
    p_adjusted: float = 1.0  # Holm over the cohorts tested
    flagged: bool = False
    causes: list[dict[str, Any]] = field(default_factory=list)  # the failing checks that drive it

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def analyse(days: Sequence[NodeDay], alpha: float = ALPHA, min_days: int = MIN_DAYS,
            min_failures: int = MIN_FAILURES) -> list[Cohort]:
    """Each cohort's rate, interval and test; flagged ones first, then by rate."""
    groups: dict[str, list[NodeDay]] = {}
    for d in days:
        groups.setdefault(d.cohort, []).append(d)
    total, failed = len(days), sum(d.failed for d in days)
    out = []
    for value, ds in groups.items():
        k = sum(d.failed for d in ds)
        low, high = wilson(k, len(ds))
        out.append(Cohort(value, len({d.node for d in ds}), len(ds), k, len({d.node for d in ds if d.failed}),
                          k / len(ds), low, high))
    tested = [c for c in out if c.value != UNKNOWN and c.node_days >= min_days and c.node_days < total]
    ps = [_p(c, total, failed) for c in tested]
    for c, p, p_adj in zip(tested, ps, holm(ps), strict=True):
        c.tested, c.p, c.p_adjusted = True, p, p_adj
        rest_rate = (failed - c.failures) / (total - c.node_days)
        c.flagged = p_adj < alpha and c.failures >= min_failures and c.rate > rest_rate
    for c in out:
        if c.flagged:
            c.causes = _causes([d for d in groups[c.value]], [d for d in days if d.cohort != c.value])
    return sorted(out, key=lambda c: (not c.flagged, -c.rate, c.value))


def _p(c: Cohort, total: int, failed: int) -> float:
    return hypergeom_sf(c.failures, total, failed, c.node_days)


def _causes(inside: Sequence[NodeDay], rest: Sequence[NodeDay], top: int = 5) -> list[dict[str, Any]]:
    """The failing checks behind a cohort: each cause's failed node-days in it and in the rest."""
    mine = Counter(c.split("|")[0] for d in inside for c in set(d.causes))
    others = Counter(c.split("|")[0] for d in rest for c in set(d.causes))
    return [{"check": name, "node_days": n, "rest_node_days": others.get(name, 0)} for name, n in mine.most_common(top)]


def backtest_rollout(days: Sequence[NodeDay], value: str, alpha: float = ALPHA, min_days: int = MIN_DAYS,
                     min_failures: int = MIN_FAILURES) -> dict[str, Any]:
    """Had the rollout of `value` stopped the day its cohort first stood apart: replay day by day
    (each day's test sees the node-days up to its end), find that day, and count the nodes that
    joined the cohort after it and failed in it (spared), beside those that joined by then and failed."""
    flagged_day = None
    for day in sorted({d.day for d in days}):
        seen = [d for d in days if d.day <= day]
        if any(c.flagged for c in analyse(seen, alpha, min_days, min_failures) if c.value == value):
            flagged_day = day
            break
    joined: dict[str, int] = {}
    failed: set[str] = set()
    for d in days:
        if d.cohort == value:
            joined.setdefault(d.node, d.day)
            if d.failed:
                failed.add(d.node)
    after = {n for n, day in joined.items() if flagged_day is not None and day > flagged_day}
    return {"value": value, "flagged_day": flagged_day, "nodes": len(joined), "failed_nodes": len(failed),
            "joined_after": len(after), "spared": len(after & failed),
            "failed_anyway": len(failed - after)}


def fact_key(by: str) -> str:
    """The fact key a `--by` names: one of BY, or any fact key the history holds (`gpu.0.vbios`)."""
    from sweeper.errors import ConfigError
    from sweeper.result import _FACT_KEY

    if by in BY or (_FACT_KEY.match(by) and len(by) <= 80):
        return by
    raise ConfigError(f"--by {by[:80]!r}: not a fact key; allowed: {', '.join(BY)} or a fact key such as gpu.0.vbios")


def known_fact(history: Any, by: str) -> str:
    """The fact key `--by` names, where it is one of BY or the label facts, or a fact some sweep in
    `history` recorded; any other name (a typo: `--by drvier`) is bad input naming those recorded,
    the closest first, rather than a report of one `(unknown)` cohort."""
    import difflib

    from sweeper.errors import ConfigError

    key = fact_key(by)
    if key in BY or key in LABEL_FACTS or history.has_facts(key, 0.0):
        return key
    recorded = history.fact_keys()
    close = difflib.get_close_matches(key, sorted({*BY, *LABEL_FACTS, *recorded}), n=3)
    raise ConfigError(f"--by {key!r}: no sweep in the history recorded this fact"
                      + (f" (did you mean {', '.join(close)}?)" if close else "")
                      + f"; the facts recorded: {', '.join(recorded[:40]) or 'none'}"
                      + (f" and {len(recorded) - 40} more" if len(recorded) > 40 else "")
                      + f"; and by name: {', '.join(BY)}")


def cohort_report(history: Any, by: str, since: float, until: float | None = None, backtest: str | None = None,
                  alpha: float = ALPHA, min_days: int = MIN_DAYS, rows: Any = None,
                  days: Sequence[NodeDay] | None = None) -> dict[str, Any]:
    """The document `sweeper cohorts` prints and the report shows: the cohorts of fact `by` over the
    window, flagged ones first, and (with `backtest`) the replay of that cohort's rollout. `rows`:
    the history's cohort_rows for `by`, or `days`: its node-days (node_days_by), when read already."""
    key = fact_key(by)
    if days is None and rows is not None:
        days = node_days(rows, since)
    elif days is None:
        sweeps, facts = history.cohort_tables((key,), since, until)
        days = node_days_by(sweeps, facts, (key,), since)[key]
    cohorts = analyse(days, alpha, min_days)
    doc: dict[str, Any] = {
        "by": key, "since": since, "node_days": len(days), "failures": sum(d.failed for d in days),
        "test": f"one-sided Fisher exact test of each cohort's failed node-days against the rest of the fleet, "
                f"Holm-corrected over the cohorts with at least {min_days} node-days; flagged below {alpha:g}",
        "interval": "95% Wilson score interval of failed node-days / node-days",
        "flagged": [c.value for c in cohorts if c.flagged], "cohorts": [c.to_dict() for c in cohorts]}
    if backtest is not None:
        doc["backtest"] = backtest_rollout(days, backtest, alpha, min_days)
        fd = doc["backtest"]["flagged_day"]
        doc["backtest"]["at"] = None if fd is None else since + fd * DAY
    return doc
