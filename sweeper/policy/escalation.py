"""The history rules: what the node's past adds to this sweep's findings (escalation ladders,
relapses, failure rates, metric trends, peer comparison, failed pairs), and `decide`, which
puts the two together into one verdict."""

from __future__ import annotations

import statistics
from typing import Any

from sweeper.policy.findings import judge_findings
from sweeper.policy.model import BUILT_IN, HOLDING, Past, Policy, Verdict, worse


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
