"""This sweep's findings: the verdict each failed check implies under the policy's findings
table, and the worst of them as the sweep's verdict before any history rule."""

from __future__ import annotations

from typing import Any

from sweeper.policy.model import HOLDING, Findings, Verdict, worse
from sweeper.xid import lookup


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
