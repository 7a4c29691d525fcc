"""From findings and the node's history to a verdict: pass, warn, reboot, replace, quarantine,
error or inconclusive, with the rules that fired as its reason.

The policy is data (`policies/*.yaml`): the severity of this sweep's findings, escalation
ladders, relapses, failure rates, metric trends, peer comparison and failed pairs. The history is read
through the `Past` protocol, so the same evaluation runs in a live sweep (the SQLite history)
and in a backtest (a replay of it)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from sweeper.clock import parse_duration
from sweeper.errors import ConfigError
from sweeper.schema import safe_load
from sweeper.xid import lookup

VERDICTS = ("pass", "warn", "reboot", "replace", "quarantine", "error", "inconclusive")
_RANK = {"pass": 0, "warn": 1, "inconclusive": 2, "error": 3, "quarantine": 4, "reboot": 5, "replace": 6}
HOLDING = ("reboot", "replace", "quarantine")
_THEN = ("warn", "reboot", "replace", "quarantine")


def worse(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reasons: tuple[str, ...]
    rules: tuple[str, ...] = ()  # the history rules that raised the verdict
    causes: tuple[str, ...] = ()  # check|code of the findings behind it
    gpus: tuple[int, ...] = ()  # the GPUs those findings name

    @property
    def holds(self) -> bool:
        return self.verdict in HOLDING


class Past(Protocol):
    """What the history rules read. Times are inclusive bounds. `sweeps` gives the finished,
    conclusive sweeps of a node that were acted on (not light checks of a busy node), oldest
    first, as {"started", "verdict", "causes"}. `pair_results` gives the node's pair results
    from either side, oldest first, as {"ts", "run_id", "partner", "status", "mode", "busbw",
    "detail", "role"} (role `node`: it was A, or the suspect of a re-pair; `partner`: it was B,
    or the known-good partner of a re-pair)."""

    def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]: ...

    def series(self, node: str, metric: str, since: float, until: float) -> list[tuple[float, int | None, float]]: ...

    def peer_values(self, profile: str, metric: str, since: float, until: float,
                    exclude: str) -> dict[str, float]: ...

    def pair_results(self, node: str, since: float, until: float) -> list[dict[str, Any]]: ...


# -- the policy as data ----------------------------------------------------------------

@dataclass(frozen=True)
class Findings:
    codes: dict[str, str] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    dcgm: dict[str, str] = field(default_factory=dict)
    xid_actions: dict[str, str] = field(default_factory=dict)
    otherwise: str = "quarantine"


@dataclass(frozen=True)
class Ladder:
    name: str
    verdicts: tuple[str, ...]
    allowed: int
    window: float
    then: str


@dataclass(frozen=True)
class Relapse:
    name: str
    window: float
    then: str


@dataclass(frozen=True)
class FailureRate:
    name: str
    k: int
    n: int
    then: str


@dataclass(frozen=True)
class Trend:
    name: str
    metric: str
    slope_per_day: float
    window: float
    min_points: int
    then: str


@dataclass(frozen=True)
class Peers:
    name: str
    metric: str
    below_median_by: float
    consecutive: int
    min_peers: int
    window: float
    then: str


@dataclass(frozen=True)
class PairFailures:
    name: str
    partners: int
    window: float
    then: str


@dataclass(frozen=True)
class Policy:
    name: str = "built-in"
    findings: Findings = field(default_factory=Findings)
    ladders: tuple[Ladder, ...] = ()
    relapses: tuple[Relapse, ...] = ()
    failure_rates: tuple[FailureRate, ...] = ()
    trends: tuple[Trend, ...] = ()
    peers: tuple[Peers, ...] = ()
    pair_failures: tuple[PairFailures, ...] = ()
    source: str = ""

    @property
    def history_window(self) -> float:
        """How far back any rule looks."""
        spans: list[float] = [r.window for r in self.ladders] + [r.window for r in self.relapses]
        spans += [r.window for r in self.trends] + [r.window for r in self.peers]
        spans += [r.window for r in self.pair_failures]
        return max(spans, default=0.0)


_SECTIONS: dict[str, tuple[type, dict[str, type | tuple[type, ...]]]] = {
    "ladders": (Ladder, {"name": str, "verdicts": list, "allowed": int, "window": (str, int, float), "then": str}),
    "relapses": (Relapse, {"name": str, "window": (str, int, float), "then": str}),
    "failure_rates": (FailureRate, {"name": str, "k": int, "n": int, "then": str}),
    "trends": (Trend, {"name": str, "metric": str, "slope_per_day": (int, float), "window": (str, int, float),
                       "min_points": int, "then": str}),
    "peers": (Peers, {"name": str, "metric": str, "below_median_by": (int, float), "consecutive": int,
                      "min_peers": int, "window": (str, int, float), "then": str}),
    "pair_failures": (PairFailures, {"name": str, "partners": int, "window": (str, int, float), "then": str}),
}


def load_policy(path: Path) -> Policy:
    try:
        raw = safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read policy {path}: {exc}") from exc
    return parse_policy(raw, str(path))


def parse_policy(raw: Any, origin: str = "policy") -> Policy:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: a policy is a mapping")
    unknown = set(raw) - {"name", "findings", *_SECTIONS}
    if unknown:
        raise ConfigError(f"{origin}: unknown key(s) {sorted(unknown)}; known: name, findings, {', '.join(_SECTIONS)}")
    f = raw.get("findings") or {}
    if not isinstance(f, dict):
        raise ConfigError(f"{origin}: findings must be a mapping")
    bad = set(f) - {"codes", "checks", "dcgm", "xid_actions", "otherwise"}
    if bad:
        raise ConfigError(f"{origin}: findings: unknown key(s) {sorted(bad)}")
    tables: dict[str, dict[str, str]] = {}
    for key in ("codes", "checks", "dcgm", "xid_actions"):
        table = f.get(key) or {}
        if not isinstance(table, dict):
            raise ConfigError(f"{origin}: findings.{key} must be a mapping")
        for k, v in table.items():
            _verdict(v, f"{origin}: findings.{key}.{k}", allow_pass=True)
        tables[key] = {str(k): str(v) for k, v in table.items()}
    otherwise = _verdict(f.get("otherwise", "quarantine"), f"{origin}: findings.otherwise")
    sections: dict[str, tuple[Any, ...]] = {}
    names: set[str] = set()
    for key, (cls, spec) in _SECTIONS.items():
        rules = raw.get(key) or []
        if not isinstance(rules, list):
            raise ConfigError(f"{origin}: {key} must be a list")
        built = []
        for i, r in enumerate(rules):
            where = f"{origin}: {key}[{i}]"
            if not isinstance(r, dict):
                raise ConfigError(f"{where}: a rule is a mapping")
            missing = set(spec) - set(r)
            extra = set(r) - set(spec)
            if missing or extra:
                raise ConfigError(f"{where}: " + "; ".join(
                    ([f"missing {sorted(missing)}"] if missing else []) + ([f"unknown {sorted(extra)}"] if extra else [])))
            kw: dict[str, Any] = {}
            for name, typ in spec.items():
                if not isinstance(r[name], typ) or isinstance(r[name], bool):
                    raise ConfigError(f"{where}.{name}: wrong type {type(r[name]).__name__}")
                value: Any = r[name]
                if name == "window":
                    try:
                        value = parse_duration(value)
                    except ValueError as exc:
                        raise ConfigError(f"{where}.window: not a duration: {value!r}") from exc
                elif name == "then":
                    value = _verdict(value, f"{where}.then")
                elif name == "verdicts":
                    value = tuple(_verdict(v, f"{where}.verdicts") for v in value)
                elif isinstance(typ, tuple) and float in typ:
                    value = float(value)
                kw[name] = value
            if kw["name"] in names:
                raise ConfigError(f"{where}: rule name {kw['name']!r} is used twice")
            names.add(kw["name"])
            if key == "failure_rates" and not 0 < kw["k"] <= kw["n"]:
                raise ConfigError(f"{where}: k must be between 1 and n")
            if key == "pair_failures" and kw["partners"] < 1:
                raise ConfigError(f"{where}: partners must be 1 or more")
            built.append(cls(**kw))
        sections[key] = tuple(built)
    return Policy(name=str(raw.get("name", "policy")), findings=Findings(**tables, otherwise=otherwise),
                  source=origin, **sections)


def _verdict(value: Any, where: str, allow_pass: bool = False) -> str:
    allowed = _THEN + (("pass",) if allow_pass else ())
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


# -- this sweep's findings -------------------------------------------------------------

def check_verdict(c: dict[str, Any], f: Findings) -> str:
    status, code, name = c.get("status"), c.get("code"), c.get("name", "")
    if status == "warn":
        return "warn"
    if status == "error":
        return "error"
    if status != "fail":
        return "pass"
    if name == "xid" and code and str(code).isdigit():
        return f.xid_actions.get(lookup(int(code)).action, f.otherwise)
    if name.startswith("dcgm.") and code is not None and str(code) in f.dcgm:
        return f.dcgm[str(code)]
    if name.startswith("dcgm."):
        return f.checks.get(name, f.otherwise)
    if code is not None and str(code) in f.codes:
        return f.codes[str(code)]
    return f.checks.get(name, f.otherwise)


def finding_key(c: dict[str, Any]) -> str:
    """What identifies a finding across sweeps: check, code and GPU."""
    gpu = c.get("gpu")
    return f"{c.get('name')}|{c.get('code') or ''}|{'' if gpu is None else gpu}"


# Findings that are another component's word about a fault, not a cause: they may hold a node, but
# never feed a ladder or a relapse. `gpu.allocatable` is the device plugin's mark, which any XID but
# six application errors sets and only a restart of the plugin clears (issue 21; see
# actions/device_plugin.py); the cause is what Sweeper reads itself.
SYMPTOMS = frozenset({"gpu.allocatable"})


def cause_key(c: dict[str, Any]) -> str:
    """What identifies a cause for escalation: check and code, on whichever GPU."""
    return f"{c.get('name')}|{c.get('code') or ''}"


def judge_findings(results: list[dict[str, Any]], f: Findings,
                   dismissed: set[str] | None = None) -> Verdict:
    """The worst verdict any finding implies, with every finding that reached it as a reason.
    A finding a person dismissed as a false positive warns instead of holding the node again;
    a new finding (another check, code or GPU) holds it as usual."""
    if not results:
        return Verdict("error", ("no check results to decide on",))
    worst = "pass"
    found: list[tuple[str, str, str]] = []
    gpus: dict[str, set[int]] = {}
    for r in results:
        if r.get("status") == "inconclusive":
            found.append(("inconclusive", r.get("msg", "check inconclusive"), ""))
            worst = worse(worst, "inconclusive")
            continue
        for c in r.get("checks") or []:
            v = check_verdict(c, f)
            if v == "pass":
                continue
            gpu = f" (GPU {c['gpu']})" if c.get("gpu") is not None else ""
            why = f"{c.get('name')}{gpu}: {c.get('message', '')}"
            if v in HOLDING and dismissed and finding_key(c) in dismissed:
                v, why = "warn", why + " (dismissed by a person as a false positive)"
            found.append((v, why, "" if c.get("name") in SYMPTOMS else cause_key(c)))
            if isinstance(c.get("gpu"), int):
                gpus.setdefault(v, set()).add(c["gpu"])
            worst = worse(worst, v)
    reasons = tuple(why for v, why, _ in found if v == worst) or ("all checks passed",)
    causes = tuple(sorted({k for v, _, k in found if v == worst and k}))
    return Verdict(worst, reasons, (), causes, tuple(sorted(gpus.get(worst, set()))))


def decide(results: list[dict[str, Any]], dismissed: set[str] | None = None, policy: Policy | None = None,
           *, node: str = "", profile: str = "", now: float = 0.0, past: Past | None = None) -> Verdict:
    """The verdict of one sweep: its findings, then (with a past) the history rules."""
    policy = policy or BUILT_IN
    base = judge_findings(results, policy.findings, dismissed)
    if past is None or base.verdict in ("inconclusive", "error"):
        return base
    metrics = [m for r in results for m in (r.get("metrics") or [])]
    raised: list[tuple[str, str, str]] = []  # (verdict, rule, reason)
    history = past.sweeps(node, now - policy.history_window, now) if policy.history_window else []
    raised += _ladders(policy, base, history, now)
    raised += _relapses(policy, base, history, now)
    raised += _failure_rates(policy, base, past, node, now)
    raised += _trends(policy, past, node, now)
    raised += _peers(policy, past, node, profile, now, metrics)
    raised += _pair_failures(policy, past, node, now)
    verdict = base.verdict
    for v, _, _ in raised:
        verdict = worse(verdict, v)
    if verdict == base.verdict and not raised:
        return base
    reasons = tuple(f"{rule}: {why}" for v, rule, why in raised if v == verdict)
    if verdict == base.verdict:
        reasons = base.reasons + reasons
    rules = tuple(rule for _, rule, _ in raised)
    return Verdict(verdict, reasons or base.reasons, rules, base.causes, base.gpus)


def _ordinal(n: int) -> str:
    return f"{n}{'tsnrhtdd'[(n // 10 % 10 != 1) * (n % 10 < 4) * n % 10::4]}"


def _ladders(policy: Policy, base: Verdict, history: list[dict[str, Any]], now: float) -> list[tuple[str, str, str]]:
    out = []
    for lad in policy.ladders:
        if base.verdict not in lad.verdicts or not base.causes:
            continue
        earlier = [s for s in history if s["started"] >= now - lad.window and s["verdict"] in lad.verdicts
                   and set(s["causes"]) & set(base.causes)]
        if len(earlier) >= lad.allowed:
            cause = sorted(set(base.causes) & {c for s in earlier for c in s["causes"]})[0]
            out.append((lad.then, lad.name, f"{_ordinal(len(earlier) + 1)} {base.verdict} for {cause.rstrip('|')} within "
                        f"{_span(lad.window)} (allowed {lad.allowed})"))
    return out


def _relapses(policy: Policy, base: Verdict, history: list[dict[str, Any]], now: float) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    if base.verdict not in HOLDING or not base.causes:
        return out
    for rel in policy.relapses:
        recent = [s for s in history if s["started"] >= now - rel.window]
        held = [i for i, s in enumerate(recent) if s["verdict"] in HOLDING and set(s["causes"]) & set(base.causes)]
        if held and any(s["verdict"] in ("pass", "warn") for s in recent[held[0] + 1:]):
            cause = sorted(set(base.causes) & set(recent[held[0]]["causes"]))[0]
            out.append((rel.then, rel.name, f"held for {cause.rstrip('|')}, passed, and failing again within {_span(rel.window)}"))
    return out


def _failure_rates(policy: Policy, base: Verdict, past: Past, node: str, now: float) -> list[tuple[str, str, str]]:
    out = []
    for fr in policy.failure_rates:
        last = past.sweeps(node, 0.0, now)[-(fr.n - 1):] if fr.n > 1 else []
        verdicts = [s["verdict"] for s in last] + [base.verdict]
        failed = sum(1 for v in verdicts if v in HOLDING)
        if len(verdicts) >= fr.n and failed >= fr.k:
            out.append((fr.then, fr.name, f"{failed} of the last {len(verdicts)} sweeps held the node"))
    return out


def slope_per_day(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (time in seconds, value), per day."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / den * 86400.0


def _trends(policy: Policy, past: Past, node: str, now: float) -> list[tuple[str, str, str]]:
    out = []
    for tr in policy.trends:
        by_gpu: dict[int | None, list[tuple[float, float]]] = {}
        for ts, gpu, value in past.series(node, tr.metric, now - tr.window, now):
            by_gpu.setdefault(gpu, []).append((ts, value))
        worst: tuple[float, int | None, int] | None = None
        for gpu, pts in by_gpu.items():
            if len(pts) < tr.min_points:
                continue
            s = slope_per_day(pts)
            if s > tr.slope_per_day and (worst is None or s > worst[0]):
                worst = (s, gpu, len(pts))
        if worst:
            s, gpu, n = worst
            where = f" on GPU {gpu}" if gpu is not None else ""
            out.append((tr.then, tr.name, f"{tr.metric}{where} rising {s:.1f}/day over {n} sweeps in "
                        f"{_span(tr.window)} (limit {tr.slope_per_day:g}/day)"))
    return out


def _peers(policy: Policy, past: Past, node: str, profile: str, now: float,
           metrics: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    out = []
    for pr in policy.peers:
        if not any(m.get("name") == pr.metric for m in metrics):
            continue  # this sweep did not measure it
        peers = past.peer_values(profile, pr.metric, now - pr.window, now, node)
        if len(peers) < pr.min_peers:
            continue
        median = statistics.median(peers.values())
        floor = median * (1 - pr.below_median_by)
        own: dict[float, float] = {}
        for ts, _gpu, value in past.series(node, pr.metric, now - pr.window, now):
            own[ts] = min(value, own.get(ts, value))
        recent = [own[t] for t in sorted(own)][-pr.consecutive:]
        if len(recent) >= pr.consecutive and all(v < floor for v in recent):
            out.append((pr.then, pr.name, f"{pr.metric} {recent[-1]:g} below the {profile or 'fleet'} median "
                        f"{median:g} by more than {pr.below_median_by:.0%} on {pr.consecutive} consecutive sweeps "
                        f"({len(peers)} peers)"))
    return out


def failed_partners(results: list[dict[str, Any]]) -> list[str]:
    """The different partners a node failed pairs with, in the order first failed with. A
    re-pair that failed counts against its suspect only: its known-good partner was paired to
    judge the suspect, and the pair's failure is the suspect's."""
    out: list[str] = []
    for r in results:
        if r["status"] != "fail" or (r["mode"] == "repair" and r["role"] == "partner"):
            continue
        if r["partner"] not in out:
            out.append(r["partner"])
    return out


def _pair_failures(policy: Policy, past: Past, node: str, now: float) -> list[tuple[str, str, str]]:
    out = []
    for pf in policy.pair_failures:
        partners = failed_partners(past.pair_results(node, now - pf.window, now))
        if len(partners) >= pf.partners:
            shown = ", ".join(partners[:5]) + (f" and {len(partners) - 5} more" if len(partners) > 5 else "")
            out.append((pf.then, pf.name, f"failed pairs with {len(partners)} different partners within "
                        f"{_span(pf.window)} ({shown}; limit {pf.partners})"))
    return out


def pair_rule(policy: Policy, past: Past, node: str, now: float) -> Verdict | None:
    """The pair rules alone, for a node whose pair just failed and waits for a re-pair: the
    verdict of the strictest rule that fires (then the node is not re-paired), or None."""
    raised = _pair_failures(policy, past, node, now)
    if not raised:
        return None
    verdict = "pass"
    for v, _, _ in raised:
        verdict = worse(verdict, v)
    return Verdict(verdict, tuple(f"{rule}: {why}" for v, rule, why in raised if v == verdict),
                   tuple(rule for _, rule, _ in raised))


def _span(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    if seconds >= 3600:
        return f"{seconds / 3600:g}h"
    return f"{seconds / 60:g}m"


# An XID's action (sweeper/xid.py BUCKET_ACTIONS, from NVIDIA's catalogue) -> verdict, for the XIDs
# that fail; those NVIDIA says need nothing or an application restart only warn and never come here.
# `reboot` is the reset path too: the remedy resets the GPUs instead when every cause is one a GPU
# reset clears (remedy.resettable) and gpu_reset is on.
XID_ACTIONS = {"reset_gpu": "reboot", "workflow_48": "reboot", "workflow_nvlink": "reboot",
               "workflow_nvlink5": "reboot", "reboot": "reboot", "replace": "replace",
               "inspect": "quarantine", "update_swfw": "quarantine", "contact_support": "quarantine"}

# The findings table alone, for callers without a policy file (the same as the shipped one's).
BUILT_IN = Policy(findings=Findings(
    codes={"REMAP_FAILURE": "replace", "RETIRED_PAGES": "replace", "REMAP_PENDING": "reboot",
           "RETIRE_PENDING": "reboot", "GPU_LOST": "reboot", "RESET_REQUIRED": "reboot", "RECOVERY_RESET": "reboot",
           "RECOVERY_REBOOT": "reboot", "NVLINK_DOWN": "reboot", "PCIE_DOWNTRAINED": "reboot",
           "NIC_PORT_DOWN": "reboot", "NIC_COUNT": "reboot", "EFA_COUNT": "reboot", "EFA_NONE": "reboot",
           "NIC_AFFINITY": "warn", "FABRIC_NOT_READY": "reboot", "GPU_RUNTIME": "reboot"},
    checks={"gpu.count": "reboot", "dcgm.gpu_count": "reboot", "sxid": "reboot", "gpu.allocatable": "quarantine"},
    dcgm={"80": "replace", "84": "reboot", "85": "reboot", "6": "reboot", "4": "reboot", "14": "reboot",
          "120": "reboot", "125": "reboot", "126": "reboot", "128": "reboot", "29": "warn"},
    xid_actions=XID_ACTIONS))
