"""Claims other tools make about a GPU node (node conditions, node taints, DRA device taints),
read against a catalogue of what each means and which of Sweeper's checks settle it; and the
judgment of one claim from a sweep's check results: confirmed, refuted or inconclusive.

Condition and taint text is written by whoever can patch the node: it is data, kept to a short
safe alphabet before it is stored, never template source and never trusted as a verdict."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from sweeper.clock import iso, read_iso
from sweeper.kube.dra import DEVICES
from sweeper.schema import ConfigProblems, check, read_yaml, safe_load

CATALOG = "claims-catalog.yaml"
OUTCOMES = ("confirmed", "refuted", "inconclusive")
# The kubelet's own conditions: no other tool's claim, never matched and never cleared.
KUBELET_CONDITIONS = frozenset({"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"})
# What Sweeper may do with a refuted claim, by what its owner documents: `never` (no way the owner
# documents that Sweeper can take), `restart-plugin` (the owner's recovery is a restart of its node
# agent, which re-evaluates health and publishes again: NVIDIA's DRA driver's kubelet plugin).
CLEAR = ("never", "restart-plugin")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/=+-]")
_Text = Annotated[str, Strict(), Field(min_length=1, max_length=300)]


def safe(text: Any, limit: int = 80) -> str:
    """Outside text kept to letters, digits and `_.:/=+-` (anything else is `?`), at most `limit`."""
    return _UNSAFE.sub("?", str(text if text is not None else ""))[:limit]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Source(_Strict):
    doc: _Text
    clear: Literal[CLEAR] = "never"  # type: ignore[valid-type]
    clear_doc: Annotated[str, Strict(), Field(max_length=300)] = ""  # where the owner documents its recovery
    note: Annotated[str, Strict()] = ""

    @model_validator(mode="after")
    def _documented(self) -> _Source:
        if self.clear != "never" and not self.clear_doc.startswith("https://"):
            raise ValueError(f"clear: {self.clear} needs clear_doc, the owner's documentation of it (https://...)")
        return self


class _Test(_Strict):
    checks: list[_Text] = Field(min_length=1)
    needs: list[_Text] = Field(min_length=1)
    pair: bool = False  # a pair run with a known-good partner also speaks, where one is configured
    boot: bool = False  # a clean result reads the current boot only (the kernel log): no word on an older claim


class _Rule(_Strict):
    source: _Text
    condition: _Text | None = None
    taint: _Text | None = None
    device_taint: _Text | None = None
    status: Literal["True", "False", "Unknown"] = "True"  # a condition's status that makes the claim
    reason: _Text = "*"  # a condition's reason (`*` a wildcard)
    value: _Text = "*"  # a taint's value
    effects: list[Literal["NoSchedule", "NoExecute", "PreferNoSchedule", "None"]] = ["NoSchedule", "NoExecute"]
    test: _Text

    @model_validator(mode="after")
    def _one_kind(self) -> _Rule:
        named = [k for k in ("condition", "taint", "device_taint") if getattr(self, k)]
        if len(named) != 1:
            raise ValueError("a rule names exactly one of condition, taint, device_taint")
        if self.condition in KUBELET_CONDITIONS:
            raise ValueError(f"{self.condition} is the kubelet's own condition, no other tool's claim")
        return self


class _CatalogFile(_Strict):
    sources: dict[str, _Source]
    tests: dict[str, _Test]
    rules: list[_Rule]


@dataclass(frozen=True)
class Test:
    name: str
    checks: tuple[str, ...]  # check names (patterns) whose results speak to the claim
    needs: tuple[str, ...]  # each must have a pass, warn or fail among them, else inconclusive
    pair: bool = False  # an NVLink or fabric claim: a pair run with a known-good partner must pass too
    boot: bool = False  # the checks read the current boot: a claim made before it is not refuted by them


@dataclass(frozen=True)
class Rule:
    source: str
    kind: str  # condition | taint | device_taint
    match: str  # the condition's type or the taint's key
    status: str
    reason: str  # pattern on a condition's reason, or on a taint's value
    effects: tuple[str, ...]
    test: str


@dataclass(frozen=True)
class Source:
    name: str
    doc: str
    clear: str
    note: str
    clear_doc: str = ""


@dataclass(frozen=True)
class Catalog:
    sources: dict[str, Source]
    tests: dict[str, Test]
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class Claim:
    """One outside claim on one node. `code` says what was claimed (the condition's type and
    reason, the taint's key and value), kept safe; `since` when it was made (0: not said)."""

    source: str
    kind: str
    code: str
    test: str
    since: float = 0.0
    detail: str = ""

    def key(self) -> tuple[str, str]:
        return self.source, self.code


def parse_catalog(raw: Any, origin: str = CATALOG, node: Any = None) -> Catalog:
    """A catalogue from its data; every problem as `file:line: key: what`."""
    spec = check(_CatalogFile, raw, origin, node, None, "claims catalogue")
    assert isinstance(spec, _CatalogFile)
    problems = [f"{origin}: rules[{i}]: {what} {name!r} is not declared under `{where}`"
                for i, r in enumerate(spec.rules)
                for what, name, where in (("source", r.source, "sources"), ("test", r.test, "tests"))
                if name not in (spec.sources if where == "sources" else spec.tests)]
    if problems:
        raise ConfigProblems(problems)
    rules = tuple(Rule(r.source, kind, str(getattr(r, kind)), r.status,
                       r.reason if kind == "condition" else r.value, tuple(r.effects), r.test)
                  for r in spec.rules for kind in ("condition", "taint", "device_taint") if getattr(r, kind))
    return Catalog(sources={k: Source(k, s.doc, s.clear, s.note, s.clear_doc) for k, s in spec.sources.items()},
                   tests={k: Test(k, tuple(t.checks), tuple(t.needs), t.pair, t.boot)
                          for k, t in spec.tests.items()}, rules=rules)


@lru_cache(maxsize=8)
def load_catalog(path: str = "") -> Catalog:
    """The author's catalogue at `path`, else the shipped one."""
    if path:
        data, node = read_yaml(Path(path), "claims catalogue")
        return parse_catalog(data, path, node)
    text = resources.files("sweeper").joinpath("data", CATALOG).read_text()
    return parse_catalog(safe_load(text), CATALOG)


def claims_on(obj: dict[str, Any], catalog: Catalog, dra_driver: str = "gpu.nvidia.com") -> list[Claim]:
    """The claims a node object carries that the catalogue knows, one per (source, code)."""
    found: dict[tuple[str, str], Claim] = {}
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    for c in status.get("conditions") or []:
        if not isinstance(c, dict) or c.get("type") in KUBELET_CONDITIONS:
            continue
        rule = _first(catalog, "condition", c.get("type"), c.get("status"), c.get("reason"), None)
        if rule:
            code = f"{safe(c.get('type'), 60)}:{safe(c.get('reason') or '-', 60)}"
            _add(found, Claim(rule.source, "condition", code, rule.test, _when(c.get("lastTransitionTime")),
                              safe(c.get("message"), 200)))
    for t in spec.get("taints") or []:
        if isinstance(t, dict):
            _taint(found, catalog, "taint", t)
    devices = ((obj.get(DEVICES) or {}).get(dra_driver) or {}) if dra_driver else {}
    for t in devices.get("taints") or []:
        if isinstance(t, dict):
            _taint(found, catalog, "device_taint", t, f"device {safe(t.get('device'), 60)}")
    return sorted(found.values(), key=lambda c: (c.source, c.code))


def _taint(found: dict[tuple[str, str], Claim], catalog: Catalog, kind: str, t: dict[str, Any],
           detail: str = "") -> None:
    rule = _first(catalog, kind, t.get("key"), None, t.get("value") or "", t.get("effect") or "None")
    if rule:
        code = f"{safe(t.get('key'), 80)}={safe(t.get('value') or '', 40)}"
        _add(found, Claim(rule.source, kind, code, rule.test, _when(t.get("timeAdded")), detail))


def _add(found: dict[tuple[str, str], Claim], claim: Claim) -> None:
    old = found.get(claim.key())
    if old is None or claim.since > old.since:
        found[claim.key()] = claim


def _first(catalog: Catalog, kind: str, match: Any, status: Any, reason: Any, effect: Any) -> Rule | None:
    for r in catalog.rules:
        if r.kind != kind or r.match != match or not fnmatchcase(str(reason or ""), r.reason):
            continue
        if kind == "condition" and r.status != status:
            continue
        if kind != "condition" and effect not in r.effects:
            continue
        return r
    return None


def _when(raw: Any) -> float:
    return (read_iso(raw) or 0.0) if isinstance(raw, str) else 0.0


def judge(claim: Claim, test: Test, checks: list[dict[str, Any]], verdict: str,
          boot: float | None = None) -> tuple[str, str]:
    """(outcome, evidence) of one claim from the sweep's checks (each with `name`, `status`,
    `message`): a failing or warning check of the test confirms it; a clean run of every needed
    check refutes it; a check that errored or was skipped, a needed one missing, or a sweep that
    was stopped leaves it inconclusive. So does a clean run of a `boot` test (the kernel log of
    the current boot) on a claim made before the node's current boot (`boot`, epoch seconds):
    that boot's log cannot hold what the claim saw."""
    if verdict == "inconclusive":
        return "inconclusive", "the sweep was stopped before its checks finished"
    speaking = [c for c in checks if any(fnmatchcase(str(c.get("name", "")), p) for p in test.checks)]
    found = [c for c in speaking if c.get("status") in ("fail", "warn")]
    if found:
        c = found[0]
        return "confirmed", safe_text(f"{c.get('name')} {c.get('status')}: {c.get('message', '')}")
    broken = [c for c in speaking if c.get("status") not in ("pass", "fail", "warn")]
    if broken:
        return "inconclusive", safe_text("; ".join(f"{c.get('name')} {c.get('status')}: {c.get('message', '')}"
                                                   for c in broken[:3]))
    missing = [p for p in test.needs if not any(fnmatchcase(str(c.get("name", "")), p) for c in speaking)]
    if missing:
        return "inconclusive", f"the {test.name} test needs {', '.join(missing)}, which this playbook did not run"
    names = sorted({str(c.get("name")) for c in speaking})
    clean = f"{len(speaking)} result(s) of {', '.join(names[:8])} passed"
    if test.boot and boot and claim.since and claim.since < boot:
        return "inconclusive", safe_text(
            f"the claim was made at {iso(claim.since)}, before the node's current boot at {iso(boot)}: the "
            f"kernel log of this boot cannot hold it ({clean}); only a check that exercises the hardware "
            "and finds the fault settles it")
    return "refuted", safe_text(clean)



def judge_pair(own: tuple[str, str], status: str, why: str, partner: str) -> tuple[str, str]:
    """(outcome, evidence) of an NVLink or fabric claim from the node's own checks (`own`, from
    `judge`) and a pair run with a known-good `partner` (its status, sweeper.pairing.pair_status,
    or "" when none ran, and why): confirmed when either found the fault on the node, refuted only
    when both ran and passed, inconclusive otherwise (no partner, a fault of the check, stopped)."""
    outcome, evidence = own
    if outcome == "confirmed":
        return own
    if status == "fail":
        return "confirmed", safe_text(f"pair with known-good {partner} failed: {why}")
    ran = f"pair with known-good {partner} {status}: {why}" if status else f"no pair run: {why}"
    if outcome == "refuted" and status in ("pass", "warn"):
        return "refuted", safe_text(f"{evidence}; {ran}")
    return "inconclusive", safe_text(f"{ran}; own checks: {outcome} ({evidence})" if outcome != "refuted"
                                     else f"{ran}; own checks passed ({evidence})")


def safe_text(text: str, limit: int = 500) -> str:
    """Evidence as stored: printable, one line, at most `limit` characters."""
    return "".join(ch if ch.isprintable() else " " for ch in text)[:limit]


def precision(counts: dict[str, int]) -> float | None:
    """confirmed / (confirmed + refuted); None before any claim was settled."""
    settled = counts.get("confirmed", 0) + counts.get("refuted", 0)
    return counts.get("confirmed", 0) / settled if settled else None
