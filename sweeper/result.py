"""The common result document: what a check prints and what every parser returns."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "sweeper.dev/result/v1"
STATUSES = ("pass", "warn", "fail", "error", "skip")
SEVERITIES = ("info", "warning", "critical", "fatal")
_RANK = {"skip": 0, "pass": 1, "warn": 2, "error": 3, "fail": 4}
# v1 gained an optional `facts` map (the node's hardware and software as read: driver, VBIOS, GPU
# serials, DCGM version, zone, rack...): a document without it is still v1, and a v1 reader that
# predates it ignores it. Facts are strings someone else wrote (NVML, node labels): capped, never code.
FACTS_MAX, FACT_KEY_MAX, FACT_VALUE_MAX = 64, 80, 160
_FACT_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")


def clean_facts(facts: Any) -> tuple[tuple[str, str], ...]:
    """Facts as sorted (key, value) pairs: keys of letters, digits and `._/-` (others dropped), values
    as text without control characters, each capped; at most FACTS_MAX of them."""
    items = facts.items() if isinstance(facts, dict) else facts or ()
    out: dict[str, str] = {}
    for key, value in items:
        if not isinstance(key, str) or not _FACT_KEY.match(key) or len(key) > FACT_KEY_MAX:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            continue
        text = "".join(ch for ch in str(value) if ch.isprintable()).strip()[:FACT_VALUE_MAX]
        if text:
            out[key] = text
    return tuple(sorted(out.items())[:FACTS_MAX])


def worst(statuses: list[str]) -> str:
    """Overall status of several: fail beats error beats warn beats pass; all skipped is skip."""
    if not statuses:
        return "error"
    return max(statuses, key=lambda s: _RANK[s])


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    message: str = ""
    severity: str = "info"
    gpu: int | None = None
    code: str | None = None
    # Where a result covers two nodes (a pair): the node whose own log (or probe) this finding came
    # from. A log may blame only the node it ran on. None: the result's own node.
    host: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "status": self.status, "severity": self.severity,
                             "message": self.message}
        if self.gpu is not None:
            d["gpu"] = self.gpu
        if self.code is not None:
            d["code"] = self.code
        if self.host is not None:
            d["host"] = self.host
        return d


# How a node's trend reads a metric of its many GPUs (`sweeper history`): a count adds up, a temperature
# is the hottest GPU's, a thermal margin (degrees to the slowdown, NVML's nvmlDeviceGetMarginTemperature)
# the GPU nearest its limit. A setting of the hardware (the PCIe link's generation and width, the
# enforced power limit) is configuration, not a count: summed over GPUs it means nothing, and it has no trend.
NODE_SETTINGS = frozenset({"pcie.gen", "pcie.width", "gpu.power_limit"})
NODE_LOWEST = frozenset({"gpu.thermal_margin"})
BOOT_TIME = "host.boot_time"  # epoch seconds the running kernel booted (node_exporter's node_boot_time_seconds)


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str = ""
    gpu: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "value": self.value, "unit": self.unit}
        if self.gpu is not None:
            d["gpu"] = self.gpu
        return d


@dataclass(frozen=True)
class Result:
    node: str
    source: str
    started: float
    finished: float
    checks: tuple[CheckResult, ...] = ()
    metrics: tuple[Metric, ...] = ()
    status: str = field(default="")
    facts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", clean_facts(self.facts))
        if not self.status:
            object.__setattr__(self, "status", worst([c.status for c in self.checks]))

    @property
    def failed_checks(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status in ("fail", "error")]

    def to_dict(self) -> dict[str, Any]:
        from sweeper.clock import iso

        return {
            "schema": SCHEMA,
            "node": self.node,
            "source": self.source,
            "started": iso(self.started),
            "finished": iso(self.finished),
            "status": self.status,
            "checks": [c.to_dict() for c in self.checks],
            "metrics": [m.to_dict() for m in self.metrics],
            **({"facts": dict(self.facts)} if self.facts else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def summary(self, limit: int = 3500) -> str:
        """A compact verdict for the termination message (Kubernetes caps it at 4 KiB)."""
        bad = [c.to_dict() for c in self.checks if c.status in ("fail", "error", "warn")]
        doc: dict[str, Any] = {"schema": SCHEMA, "node": self.node, "status": self.status,
               "checks": len(self.checks), "problems": bad}
        text = json.dumps(doc, separators=(",", ":"))
        while len(text.encode()) > limit and doc["problems"]:
            doc["problems"] = doc["problems"][:-1]
            doc["truncated"] = True
            text = json.dumps(doc, separators=(",", ":"))
        return text


def error_result(node: str, source: str, message: str, now: float, code: str | None = None) -> Result:
    """A result that says the check itself could not be read or run: never a pass."""
    return Result(node=node, source=source, started=now, finished=now,
                  checks=(CheckResult(name=f"{source}.read", status="error", severity="critical",
                                      message=message, code=code),))


TOOL_CHECK = "check.tool"  # the check could not run at all: a fault of the tool, never of the node
TOOL_SEP = " — "  # a tool fault's message: what went wrong (the same on every node), then its detail


def tool_result(node: str, now: float, code: str, summary: str, detail: str = "") -> Result:
    """The check never ran (its image, its spec, admission, a missing program): `error`, with
    the cause in words. `summary` names the cause alike on every node, so that a run can see
    the same tool fault repeat; `detail` carries what is particular to this pod."""
    message = summary + (TOOL_SEP + detail if detail and detail not in summary else "")
    return Result(node=node, source="sweeper", started=now, finished=now, checks=(CheckResult(
        TOOL_CHECK, "error", message, "critical", code=code),))


def tool_cause(checks: list[dict[str, Any]]) -> str:
    """The cause of a tool fault among result checks ('' if none): its code and summary."""
    for c in checks:
        if c.get("name") == TOOL_CHECK and c.get("status") == "error":
            return f"{c.get('code') or ''}: {str(c.get('message') or '').split(TOOL_SEP)[0]}"
    return ""
