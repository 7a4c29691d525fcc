"""`sweeper backtest`: replay the recorded history under another policy, and set what it would
have decided next to what was decided.

Each recorded conclusive sweep is decided again, in time order, from its recorded checks and
metrics, at the moment it was first decided. The history rules see the metrics as recorded
(this node's trends, its peers) and the verdicts of the replay itself (ladders, relapses,
failure rates), so a policy that escalates sooner changes what follows. A person's dismissal
(releasing a node Sweeper held) is replayed as it happened: from then on the findings of the
sweep that held the node warn instead of holding it, in the replay as they did live.

Pair sweeps are replayed too. A node whose pair failed waited for a re-pair (its recorded
verdict `inconclusive`) unless a pair rule held it at once: the replay asks the candidate's
pair rules again, over the recorded pair results. The suspect of a failed re-pair (the culprit)
is decided again from the pair's recorded findings, as any sweep is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sweeper.policy import HOLDING, Policy, Verdict, decide, finding_key, pair_rule


class ReplayPast:
    """The Past of a replay: recorded metrics and pair results, replayed verdicts."""

    def __init__(self, history: Any) -> None:
        self.history = history
        self.decided: dict[str, list[dict[str, Any]]] = {}

    def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        return [s for s in self.decided.get(node, []) if since <= s["started"] <= until]

    def series(self, node: str, metric: str, since: float, until: float) -> list[tuple[float, int | None, float]]:
        return list(self.history.series(node, metric, since, until))

    def peer_values(self, profile: str, metric: str, since: float, until: float, exclude: str) -> dict[str, float]:
        return dict(self.history.peer_values(profile, metric, since, until, exclude))

    def pair_results(self, node: str, since: float, until: float) -> list[dict[str, Any]]:
        return list(self.history.pair_results(node, since, until))


@dataclass
class Decision:
    node: str
    at: float
    recorded: str
    replayed: str
    rules: list[str]
    reasons: list[str]
    partner: str | None = None  # a sweep of a pair: the other node, and the pair's mode (sweep, repair)
    mode: str | None = None
    cluster: str | None = None  # set where several clusters are replayed (backtest_fleet)

    @property
    def key(self) -> str:
        """The node as the replay names it: `cluster/node` where several clusters are replayed (node
        names repeat across clusters; Kubernetes names hold no '/')."""
        return f"{self.cluster}/{self.node}" if self.cluster is not None else self.node

    @property
    def differs(self) -> bool:
        return self.recorded != self.replayed


@dataclass
class Backtest:
    policy: str
    since: float
    decisions: list[Decision] = field(default_factory=list)

    def first_holds(self, which: str) -> dict[str, Decision]:
        """Node (its `key`) to its first holding decision, recorded or replayed."""
        out: dict[str, Decision] = {}
        for d in self.decisions:
            v = d.recorded if which == "recorded" else d.replayed
            if v in HOLDING and d.key not in out:
                out[d.key] = d
        return out

    def pair_changes(self) -> list[Decision]:
        """The decisions on pairs that the policy changes: culprits it would hold otherwise, and
        nodes of a failed pair it would hold at once or let wait for their re-pair."""
        return [d for d in self.decisions if d.partner is not None and d.differs]

    def counts(self, which: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.decisions:
            v = d.recorded if which == "recorded" else d.replayed
            out[v] = out.get(v, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "since": self.since, "sweeps": len(self.decisions),
                "differ": sum(d.differs for d in self.decisions),
                "recorded": self.counts("recorded"), "replayed": self.counts("replayed"),
                "decisions": [{"node": d.node, **({"cluster": d.cluster} if d.cluster is not None else {}), "at": d.at, "recorded": d.recorded, "replayed": d.replayed,
                               "rules": d.rules, "reasons": d.reasons,
                               **({"pair": {"partner": d.partner, "mode": d.mode}} if d.partner is not None else {})}
                              for d in self.decisions if d.differs or d.replayed in HOLDING or d.recorded in HOLDING],
                "pair_changes": len(self.pair_changes())}


def backtest_fleet(history: Any, policy: Policy, since: float) -> Backtest:
    """Every cluster of the history replayed, each on its own rows (a node's past is its cluster's),
    the decisions in time order, each naming its cluster."""
    out = Backtest(policy.name, since)
    for cluster in history.clusters():
        for d in backtest(history.for_cluster(cluster), policy, since).decisions:
            d.cluster = cluster
            out.decisions.append(d)
    out.decisions.sort(key=lambda d: d.at)
    return out


def backtest(history: Any, policy: Policy, since: float) -> Backtest:
    past = ReplayPast(history)
    out = Backtest(policy.name, since)
    dismissals: dict[str, list[tuple[float, set[str]]]] = {}
    for d in history.dismissals():
        keys = {finding_key(f) for f in d["findings"]} | set(d.get("keys") or [])  # keys: seen in the cluster
        dismissals.setdefault(d["node"], []).append((d["ts"], keys))
    for row in history.replay_rows(since):
        docs = history.sweep_documents(row["id"])
        at = row["decided"] if row["decided"] is not None else row["finished"]
        dismissed = next((keys for ts, keys in reversed(dismissals.get(row["node"], [])) if ts <= at), set())
        if row.get("pair_status") == "fail" and row.get("pair_mode") == "sweep":
            # waiting for a re-pair, unless a pair rule holds it now (as the sweep asks it)
            found = pair_rule(policy, past, row["node"], max(at, row["pair_ts"]))
            v = found if found is not None and found.holds else Verdict(
                "inconclusive", (f"pair with {row['pair_partner']} failed; re-pairing with a known-good partner",))
        else:
            v = decide(docs, dismissed, policy, node=row["node"], profile=row["profile"] or "", now=at, past=past)
        if v.verdict not in ("error", "inconclusive") and row["kind"] in ("sweep", "pair"):
            past.decided.setdefault(row["node"], []).append(
                {"started": row["started"], "verdict": v.verdict, "causes": list(v.causes)})
        recorded = row["policy_verdict"] or row["verdict"]
        out.decisions.append(Decision(row["node"], at, recorded, v.verdict, list(v.rules), list(v.reasons),
                                      row.get("pair_partner"), row.get("pair_mode")))
    return out
