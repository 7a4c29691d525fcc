"""Outside claims within a run: read at discovery from the nodes listed (an idle node carrying a
claim not yet settled is swept first, within the same gates and budget as any other), and judged
after the node's sweep from its own checks, each judgment written to the history."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sweeper.claims import Claim, claims_on, judge
from sweeper.sweep.state import Run


def pending(run: Run, nodes: list[dict[str, Any]]) -> dict[str, str]:
    """The claims no sweep has confirmed or refuted since they were made, by node, into
    `run.claims` (what this run's sweeps judge: a claim settled once is not counted again, whatever
    a later sweep finds); node -> why it goes first."""
    catalog = run.sweep.claims_catalog
    if catalog is None:
        run.claims = {}
        return {}
    found: dict[str, list[Claim]] = {}
    for obj in nodes:
        got = claims_on(obj, catalog, run.cfg.dra_driver)
        if got:
            found[obj["metadata"]["name"]] = got
    settled = run.rec.claims_settled(sorted(found)) if found else {}
    run.claims, out = {}, {}
    for node, got in found.items():
        untested = [c for c in got if (node, c.source, c.code) not in settled
                    or settled[(node, c.source, c.code)] < c.since]
        if untested:
            run.claims[node] = untested
            out[node] = "untested claim " + ", ".join(f"{c.source} {c.code}" for c in untested[:3]) + \
                (f" (+{len(untested) - 3})" if len(untested) > 3 else "")
    return out


def judge_node(run: Run, node: str, sweep_id: int, verdict: str) -> None:
    """Judge each untested claim the node carried at discovery from this sweep's checks, and record it."""
    checks = run.checks.pop(node, [])
    catalog = run.sweep.claims_catalog
    if catalog is None or run.dry_run or not run.claims.get(node):
        return
    for claim in run.claims[node]:
        outcome, evidence = judge(claim, catalog.tests[claim.test], checks, verdict)
        run.rec.claim_result(run.id, sweep_id, node, run.clock.now(), asdict(claim), outcome, evidence)
        run.log(node, f"claim of {claim.source} {claim.code}: {outcome} ({evidence})")
        run.emit("claim", {"node": node, "source": claim.source, "code": claim.code, "outcome": outcome,
                           "evidence": evidence})
