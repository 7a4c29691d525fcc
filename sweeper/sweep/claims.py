"""Outside claims within a run: read at discovery from the nodes listed (an idle node carrying a
claim not yet settled is swept first, within the same gates and budget as any other), and judged
after the node's sweep from its own checks, each judgment written to the history."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sweeper.claims import Claim, claims_on, judge, judge_pair
from sweeper.errors import KubeError
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
    """Judge each untested claim the node carried at discovery from this sweep's checks, and record
    it. An NVLink or fabric claim (a test with `pair`) that the node's own checks did not confirm
    waits, where a pair playbook is configured, for a pair run with a known-good partner (run.fabric,
    taken by the queue) when the node went back; a node kept held or a sweep that did not pass has
    no pair, and its claim is settled now."""
    checks = run.checks.pop(node, [])
    boot = run.boots.pop(node, None)
    catalog = run.sweep.claims_catalog
    if catalog is None or run.dry_run or not run.claims.get(node):
        return
    paired = run.sweep.claims_pair_playbook is not None
    refuted: list[Claim] = []
    for claim in run.claims[node]:
        test = catalog.tests[claim.test]
        outcome, evidence = judge(claim, test, checks, verdict, boot)
        if test.pair and paired and outcome != "confirmed":
            if verdict in ("pass", "warn"):
                with run.mutex:
                    run.fabric.setdefault(node, []).append((claim, outcome, evidence, sweep_id))
                continue
            outcome, evidence = judge_pair((outcome, evidence), "", f"the node's sweep ended {verdict}", "")
        record_claim(run, node, sweep_id, claim, outcome, evidence)
        if outcome == "refuted":
            refuted.append(claim)
    clear(run, node, refuted)


def judge_fabric(run: Run, node: str, status: str, why: str, partner: str = "") -> None:
    """Settle the node's NVLink and fabric claims that waited for a pair: from the pair run's status
    with known-good `partner` ("" when none ran, and `why` says why not)."""
    with run.mutex:
        waiting = run.fabric.pop(node, [])
    refuted: list[Claim] = []
    for claim, outcome, evidence, sweep_id in waiting:
        got = judge_pair((outcome, evidence), status, why, partner)
        record_claim(run, node, sweep_id, claim, *got)
        if got[0] == "refuted":
            refuted.append(claim)
    clear(run, node, refuted)


def record_claim(run: Run, node: str, sweep_id: int, claim: Claim, outcome: str, evidence: str) -> None:
    run.rec.claim_result(run.id, sweep_id, node, run.clock.now(), asdict(claim), outcome, evidence)
    run.log(node, f"claim of {claim.source} {claim.code}: {outcome} ({evidence})")
    run.emit("claim", {"node": node, "source": claim.source, "code": claim.code, "outcome": outcome,
                       "evidence": evidence})


def clear(run: Run, node: str, refuted: list[Claim]) -> None:
    """Clear the claims a test refuted, where the config's `claims_clear` names their source and its
    owner documents a way (the catalogue's `clear`): NVIDIA's DRA driver's device taints stay until
    its kubelet plugin restarts, which then taints again only what NVML still reports
    (dra-driver-nvidia-gpu, docs/guides/gpu-health-checking.md, "Recovering from an unhealthy
    device"), so its pod on this node is deleted and its DaemonSet starts another. A claim that
    comes back is a new claim, tested again. A restart that fails is said; it is no finding."""
    catalog = run.sweep.claims_catalog
    if catalog is None:
        return
    plugin = sorted({c.source for c in refuted if c.kind == "device_taint" and c.source in run.cfg.claims_clear
                     and catalog.sources[c.source].clear == "restart-plugin"})
    if not plugin:
        return
    try:
        pods = []
        for entry in run.cfg.claims_dra_plugin_pods:
            namespace, _, selector = entry.partition("/")
            pods += [(namespace, p["metadata"]["name"]) for p in run.kube.list_pods(
                field_selector=f"spec.nodeName={node}", label_selector=selector)
                     if p["metadata"].get("namespace") == namespace]
        if not pods:
            raise KubeError(f"no kubelet plugin pod on the node matches claims_dra_plugin_pods "
                            f"({', '.join(run.cfg.claims_dra_plugin_pods)})")
        for namespace, name in pods:
            run.rec.intent(run.id, node, run.clock.now(), "delete-pod", "before", f"{namespace}/{name}")
            run.kube.delete_pod(namespace, name)
            run.rec.intent(run.id, node, run.clock.now(), "delete-pod", "after", f"{namespace}/{name}")
        what = (f"{', '.join(plugin)}: kubelet plugin {', '.join(f'{ns}/{n}' for ns, n in pods)} restarted "
                f"to clear refuted device taints ({', '.join(c.code for c in refuted if c.kind == 'device_taint')})")
        run.rec.action(run.id, node, run.clock.now(), "claim-cleared", what[:1000])
    except KubeError as exc:
        what = f"{', '.join(plugin)}: refuted device taints not cleared: {exc}"
        run.rec.action(run.id, node, run.clock.now(), "claim-not-cleared", what[:1000])
    run.log(node, what)
    run.emit("claim-clear", {"node": node, "sources": plugin, "detail": what})
