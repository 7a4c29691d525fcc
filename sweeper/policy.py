"""From findings to a verdict: pass, warn, reboot, replace, quarantine, error or inconclusive."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweeper.xid import lookup

VERDICTS = ("pass", "warn", "reboot", "replace", "quarantine", "error", "inconclusive")
_RANK = {"pass": 0, "warn": 1, "inconclusive": 2, "error": 3, "quarantine": 4, "reboot": 5, "replace": 6}
HOLDING = ("reboot", "replace", "quarantine")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reasons: tuple[str, ...]

    @property
    def holds(self) -> bool:
        return self.verdict in HOLDING


# DCGM_FR_* error ids whose meaning settles the verdict; other DCGM failures quarantine.
DCGM_VERDICTS = {"80": "replace", "84": "reboot", "85": "reboot", "6": "reboot", "4": "reboot", "120": "reboot", "14": "reboot",
                 "125": "reboot", "126": "reboot", "128": "reboot", "29": "warn"}


# Finding codes of the node checks and what they call for; other failures quarantine.
CODE_VERDICTS = {
    "REMAP_FAILURE": "replace", "RETIRED_PAGES": "replace",
    "REMAP_PENDING": "reboot", "RETIRE_PENDING": "reboot", "GPU_LOST": "reboot", "RESET_REQUIRED": "reboot",
    "RECOVERY_RESET": "reboot", "RECOVERY_REBOOT": "reboot", "NVLINK_DOWN": "reboot", "PCIE_DOWNTRAINED": "reboot",
    "NIC_PORT_DOWN": "reboot", "NIC_COUNT": "reboot", "EFA_COUNT": "reboot", "EFA_NONE": "reboot",
    "NIC_AFFINITY": "warn",
}


def _check_verdict(c: dict[str, Any]) -> str:
    status, code, name = c.get("status"), c.get("code"), c.get("name", "")
    if status == "warn":
        return "warn"
    if status == "error":
        return "error"
    if status != "fail":
        return "pass"
    if code in CODE_VERDICTS and name != "xid" and not name.startswith("dcgm."):
        return CODE_VERDICTS[str(code)]
    if name == "xid" and code and str(code).isdigit():
        action = lookup(int(code)).action
        return {"replace": "replace", "reboot": "reboot", "reset_gpu": "reboot"}.get(action, "quarantine")
    if name in ("gpu.count", "dcgm.gpu_count"):
        return "reboot"
    if name.startswith("dcgm.") and code in DCGM_VERDICTS:
        return DCGM_VERDICTS[str(code)]
    return "quarantine"


def finding_key(c: dict[str, Any]) -> str:
    """What identifies a finding across sweeps: check, code and GPU."""
    gpu = c.get("gpu")
    return f"{c.get('name')}|{c.get('code') or ''}|{'' if gpu is None else gpu}"


def decide(results: list[dict[str, Any]], dismissed: set[str] | None = None) -> Verdict:
    """The worst verdict any finding implies, with every finding that reached it as a reason.
    A finding a person dismissed as a false positive warns instead of holding the node again;
    a new finding (another check, code or GPU) holds it as usual."""
    if not results:
        return Verdict("error", ("no check results to decide on",))
    worst = "pass"
    reasons: list[tuple[str, str]] = []
    for r in results:
        if r.get("status") == "inconclusive":
            v, why = "inconclusive", r.get("msg", "check inconclusive")
            reasons.append((v, why))
            worst = max(worst, v, key=_RANK.__getitem__)
            continue
        for c in r.get("checks") or []:
            v = _check_verdict(c)
            if v == "pass":
                continue
            gpu = f" (GPU {c['gpu']})" if c.get("gpu") is not None else ""
            why = f"{c.get('name')}{gpu}: {c.get('message', '')}"
            if v in HOLDING and dismissed and finding_key(c) in dismissed:
                v, why = "warn", why + " (dismissed by a person as a false positive)"
            reasons.append((v, why))
            worst = max(worst, v, key=_RANK.__getitem__)
    return Verdict(worst, tuple(why for v, why in reasons if v == worst) or ("all checks passed",))
