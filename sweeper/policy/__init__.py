"""From findings and the node's history to a verdict: pass, warn, reboot, replace, quarantine,
error or inconclusive, with the rules that fired as its reason.

The policy is data (`policies/*.yaml`): the severity of this sweep's findings, escalation
ladders, relapses, failure rates, metric trends, peer comparison and failed pairs. The history is read
through the `Past` protocol, so the same evaluation runs in a live sweep (the SQLite history)
and in a backtest (a replay of it).
The package: `model` (verdicts, the policy's rules as data, their loader), `findings` (this
sweep's findings to a verdict) and `escalation` (the history rules, and `decide`)."""

from __future__ import annotations

from sweeper.policy.escalation import decide, failed_partners, pair_rule, slope_per_day
from sweeper.policy.findings import SYMPTOMS, cause_key, check_verdict, finding_key, judge_findings
from sweeper.policy.model import (
    BUILT_IN,
    HOLDING,
    VERDICTS,
    XID_ACTIONS,
    FailureRate,
    Findings,
    Ladder,
    PairFailures,
    Past,
    Peers,
    Policy,
    Relapse,
    Trend,
    Verdict,
    load_policy,
    parse_policy,
    policy_path,
    worse,
)

__all__ = ["BUILT_IN", "HOLDING", "SYMPTOMS", "VERDICTS", "XID_ACTIONS", "FailureRate", "Findings", "Ladder",
           "PairFailures", "Past", "Peers", "Policy", "Relapse", "Trend", "Verdict", "cause_key", "check_verdict",
           "decide", "failed_partners", "finding_key", "judge_findings", "load_policy", "pair_rule",
           "parse_policy", "policy_path", "slope_per_day", "worse"]
