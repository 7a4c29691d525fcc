"""The CronJob's RBAC is exactly what Sweeper uses: every API call the commands make against
the simulated cluster (a sweep that replaces through Karpenter, sets the node condition,
reconciles a dead run; an operator's drain) is allowed by deploy/cronjob.yaml, and every rule
there is needed by at least one call."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

ROOT = Path(__file__).resolve().parents[2]
VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def call_of(method: str, path: str) -> tuple[str, str, str, str | None]:
    """(api group, resource[/subresource], verb, namespace) of a request path."""
    m = re.match(r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<rest>.+)$", path)
    assert m, path
    parts = m.group("rest").split("/")
    resource, name, sub = parts[0], parts[1] if len(parts) > 1 else None, parts[2] if len(parts) > 2 else None
    if method == "GET":
        verb = "get" if name else "list"
    else:
        verb = VERBS[method]
    return m.group("group") or "", resource + (f"/{sub}" if sub else ""), verb, m.group("ns")


def rbac() -> list[tuple[str, str | None, dict[str, Any]]]:
    """(role name, namespace or None for the ClusterRole, rule), Roles first."""
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "cronjob.yaml").read_text()) if d]
    out = []
    for d in sorted(docs, key=lambda d: d["kind"] != "Role"):
        if d["kind"] in ("Role", "ClusterRole"):
            for rule in d["rules"]:
                out.append((d["metadata"]["name"], d["metadata"].get("namespace"), rule))
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in docs if b["kind"].endswith("Binding")
             and any(s["name"] == "sweeper" and s["kind"] == "ServiceAccount" for s in b["subjects"])}
    assert bound == {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("Role", "ClusterRole")}
    return out


def covers(rule: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    return group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]


def test_the_cluster_role_is_exactly_what_sweeper_uses(make_sim, history: History, tmp_path: Path) -> None:
    spec = fleet_spec(nodes=4, faults={"gpu-01": {"remap_failure": [2]}},
                      workloads=[{"node": "gpu-03", "gpus": 8, "duration": None}])
    spec["node_groups"][0]["labels"] = {"karpenter.sh/nodepool": "gpu"}
    sim: Sim = make_sim(spec)
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="the workload")
    history.run_started("sw-dead", sim.cluster.clock.now() - 7200, "sweep")  # a run that died: reconciled
    start = len(sim.cluster.store.requests)
    cfg = replace(TEST_CONFIG, node_condition=True, light_playbook="",
                  remediation={"default": "manual", "by_pool": {"gpu": "karpenter"}, "by_profile": {}})
    report = run_sweep(sim, history, cfg)
    assert {o.node: o.verdict for o in report.outcomes}["gpu-01"] == "replace"
    # an operator's playbook that drains a node through the Eviction API
    book = tmp_path / "drain.yaml"
    book.write_text("name: drain\ntasks:\n  - drain: {timeout: 10m}\n")
    res = CliRunner().invoke(main, ["run", str(book), "--node", "gpu-03", "--kubeconfig", str(sim.kubeconfig),
                                    "--state", str(tmp_path / "run.db")])
    assert res.exit_code == 0, res.output
    calls = {call_of(m, p) for m, p in sim.cluster.store.requests[start:]}
    rules = rbac()
    used: set[int] = set()
    denied = []
    for group, resource, verb, ns in sorted(calls, key=str):
        match = next((i for i, (_, rns, rule) in enumerate(rules)
                      if (rns is None or rns == ns) and covers(rule, group, resource, verb)), None)
        if match is None:
            denied.append((group, resource, verb, ns))
        else:
            used.add(match)
    assert len(calls) >= 15 and len(used) == len(rules)
    assert denied == [], f"calls the RBAC does not allow: {denied}"
    unused = [(name, ns, rule, verb) for i, (name, ns, rule) in enumerate(rules) for verb in rule["verbs"]
              if not any(covers({**rule, "verbs": [verb]}, g, r, v) and (ns is None or ns == cns)
                         and rules_index(rules, g, r, v, cns) == i for g, r, v, cns in calls)]
    assert unused == [], f"RBAC that no call needs: {unused}"


def rules_index(rules: list[tuple[str, str | None, dict[str, Any]]], group: str, resource: str, verb: str,
                ns: str | None) -> int | None:
    return next((i for i, (_, rns, rule) in enumerate(rules)
                 if (rns is None or rns == ns) and covers(rule, group, resource, verb)), None)
