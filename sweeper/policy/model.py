"""The verdicts, and the policy as data: the rules of `policies/*.yaml`, their strict loader, the
`Past` a history rule reads, and the built-in findings table for callers without a policy file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from sweeper.clock import parse_duration
from sweeper.errors import ConfigError
from sweeper.schema import safe_load

VERDICTS = ("pass", "warn", "reboot", "replace", "quarantine", "error", "inconclusive")
_RANK = {"pass": 0, "warn": 1, "inconclusive": 2, "error": 3, "quarantine": 4, "reboot": 5, "replace": 6}
HOLDING = ("reboot", "replace", "quarantine")
_THEN = ("warn", "reboot", "replace", "quarantine")


def worse(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reasons: tuple[str, ...]
    rules: tuple[str, ...] = ()  # the history rules that raised the verdict
    causes: tuple[str, ...] = ()  # check|code of the findings behind it
    gpus: tuple[int, ...] = ()  # the GPUs those findings name

    @property
    def holds(self) -> bool:
        return self.verdict in HOLDING


class Past(Protocol):
    """What the history rules read. Times are inclusive bounds. `sweeps` gives the finished,
    conclusive sweeps of a node that were acted on (not light checks of a busy node), oldest
    first, as {"started", "verdict", "causes"}. `pair_results` gives the node's pair results
    from either side, oldest first, as {"ts", "run_id", "partner", "status", "mode", "busbw",
    "detail", "role"} (role `node`: it was A, or the suspect of a re-pair; `partner`: it was B,
    or the known-good partner of a re-pair)."""

    def sweeps(self, node: str, since: float, until: float) -> list[dict[str, Any]]: ...

    def series(self, node: str, metric: str, since: float, until: float) -> list[tuple[float, int | None, float]]: ...

    def peer_values(self, profile: str, metric: str, since: float, until: float,
                    exclude: str) -> dict[str, float]: ...

    def pair_results(self, node: str, since: float, until: float) -> list[dict[str, Any]]: ...


# -- the policy as data ----------------------------------------------------------------

@dataclass(frozen=True)
class Findings:
    codes: dict[str, str] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    dcgm: dict[str, str] = field(default_factory=dict)
    xid_actions: dict[str, str] = field(default_factory=dict)
    otherwise: str = "quarantine"


@dataclass(frozen=True)
class Ladder:
    name: str
    verdicts: tuple[str, ...]
    allowed: int
    window: float
    then: str


@dataclass(frozen=True)
class Relapse:
    name: str
    window: float
    then: str


@dataclass(frozen=True)
class FailureRate:
    name: str
    k: int
    n: int
    then: str


@dataclass(frozen=True)
class Trend:
    name: str
    metric: str
    slope_per_day: float
    window: float
    min_points: int
    then: str


@dataclass(frozen=True)
class Peers:
    name: str
    metric: str
    below_median_by: float
    consecutive: int
    min_peers: int
    window: float
    then: str


@dataclass(frozen=True)
class PairFailures:
    name: str
    partners: int
    window: float
    then: str


@dataclass(frozen=True)
class Policy:
    name: str = "built-in"
    findings: Findings = field(default_factory=Findings)
    ladders: tuple[Ladder, ...] = ()
    relapses: tuple[Relapse, ...] = ()
    failure_rates: tuple[FailureRate, ...] = ()
    trends: tuple[Trend, ...] = ()
    peers: tuple[Peers, ...] = ()
    pair_failures: tuple[PairFailures, ...] = ()
    source: str = ""

    @property
    def history_window(self) -> float:
        """How far back any rule looks."""
        spans: list[float] = [r.window for r in self.ladders] + [r.window for r in self.relapses]
        spans += [r.window for r in self.trends] + [r.window for r in self.peers]
        spans += [r.window for r in self.pair_failures]
        return max(spans, default=0.0)


_SECTIONS: dict[str, tuple[type, dict[str, type | tuple[type, ...]]]] = {
    "ladders": (Ladder, {"name": str, "verdicts": list, "allowed": int, "window": (str, int, float), "then": str}),
    "relapses": (Relapse, {"name": str, "window": (str, int, float), "then": str}),
    "failure_rates": (FailureRate, {"name": str, "k": int, "n": int, "then": str}),
    "trends": (Trend, {"name": str, "metric": str, "slope_per_day": (int, float), "window": (str, int, float),
                       "min_points": int, "then": str}),
    "peers": (Peers, {"name": str, "metric": str, "below_median_by": (int, float), "consecutive": int,
                      "min_peers": int, "window": (str, int, float), "then": str}),
    "pair_failures": (PairFailures, {"name": str, "partners": int, "window": (str, int, float), "then": str}),
}


def policy_path(policies: Path, name: str) -> Path:
    """Where a policy named in a config, a playbook's `decide` or a command line is: a path where the
    name has a `/`, else a file of `policies` (the config's policy_dir, else the shipped folder)."""
    return Path(name) if "/" in name else policies / name


def load_policy(path: Path) -> Policy:
    try:
        raw = safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read policy {path}: {exc}") from exc
    return parse_policy(raw, str(path))


def parse_policy(raw: Any, origin: str = "policy") -> Policy:
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: a policy is a mapping")
    unknown = set(raw) - {"name", "findings", *_SECTIONS}
    if unknown:
        raise ConfigError(f"{origin}: unknown key(s) {sorted(unknown)}; known: name, findings, {', '.join(_SECTIONS)}")
    f = raw.get("findings") or {}
    if not isinstance(f, dict):
        raise ConfigError(f"{origin}: findings must be a mapping")
    bad = set(f) - {"codes", "checks", "dcgm", "xid_actions", "otherwise"}
    if bad:
        raise ConfigError(f"{origin}: findings: unknown key(s) {sorted(bad)}")
    tables: dict[str, dict[str, str]] = {}
    for key in ("codes", "checks", "dcgm", "xid_actions"):
        table = f.get(key) or {}
        if not isinstance(table, dict):
            raise ConfigError(f"{origin}: findings.{key} must be a mapping")
        for k, v in table.items():
            _verdict(v, f"{origin}: findings.{key}.{k}", allow_pass=True)
        tables[key] = {str(k): str(v) for k, v in table.items()}
    otherwise = _verdict(f.get("otherwise", "quarantine"), f"{origin}: findings.otherwise")
    sections: dict[str, tuple[Any, ...]] = {}
    names: set[str] = set()
    for key, (cls, spec) in _SECTIONS.items():
        rules = raw.get(key) or []
        if not isinstance(rules, list):
            raise ConfigError(f"{origin}: {key} must be a list")
        built = []
        for i, r in enumerate(rules):
            where = f"{origin}: {key}[{i}]"
            if not isinstance(r, dict):
                raise ConfigError(f"{where}: a rule is a mapping")
            missing = set(spec) - set(r)
            extra = set(r) - set(spec)
            if missing or extra:
                raise ConfigError(f"{where}: " + "; ".join(
                    ([f"missing {sorted(missing)}"] if missing else []) + ([f"unknown {sorted(extra)}"] if extra else [])))
            kw: dict[str, Any] = {}
            for name, typ in spec.items():
                if not isinstance(r[name], typ) or isinstance(r[name], bool):
                    raise ConfigError(f"{where}.{name}: wrong type {type(r[name]).__name__}")
                value: Any = r[name]
                if name == "window":
                    try:
                        value = parse_duration(value)
                    except ValueError as exc:
                        raise ConfigError(f"{where}.window: not a duration: {value!r}") from exc
                elif name == "then":
                    value = _verdict(value, f"{where}.then")
                elif name == "verdicts":
                    value = tuple(_verdict(v, f"{where}.verdicts") for v in value)
                elif isinstance(typ, tuple) and float in typ:
                    value = float(value)
                kw[name] = value
            if kw["name"] in names:
                raise ConfigError(f"{where}: rule name {kw['name']!r} is used twice")
            names.add(kw["name"])
            if key == "failure_rates" and not 0 < kw["k"] <= kw["n"]:
                raise ConfigError(f"{where}: k must be between 1 and n")
            if key == "pair_failures" and kw["partners"] < 1:
                raise ConfigError(f"{where}: partners must be 1 or more")
            built.append(cls(**kw))
        sections[key] = tuple(built)
    return Policy(name=str(raw.get("name", "policy")), findings=Findings(**tables, otherwise=otherwise),
                  source=origin, **sections)


def _verdict(value: Any, where: str, allow_pass: bool = False) -> str:
    allowed = _THEN + (("pass",) if allow_pass else ())
    if value not in allowed:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


# An XID's action (sweeper/xid.py BUCKET_ACTIONS, from NVIDIA's catalogue) -> verdict, for the XIDs
# that fail; those NVIDIA says need nothing or an application restart only warn and never come here.
# `reboot` is the reset path too: the remedy resets the GPUs instead when every cause is one a GPU
# reset clears (remedy.resettable) and gpu_reset is on.
XID_ACTIONS = {"reset_gpu": "reboot", "workflow_48": "reboot", "workflow_nvlink": "reboot",
               "workflow_nvlink5": "reboot", "reboot": "reboot", "replace": "replace",
               "inspect": "quarantine", "update_swfw": "quarantine", "contact_support": "quarantine"}

# The findings table alone, for callers without a policy file (the same as the shipped one's).
BUILT_IN = Policy(findings=Findings(
    codes={"REMAP_FAILURE": "replace", "RETIRED_PAGES": "replace", "REMAP_PENDING": "reboot",
           "RETIRE_PENDING": "reboot", "GPU_LOST": "reboot", "RESET_REQUIRED": "reboot", "RECOVERY_RESET": "reboot",
           "RECOVERY_REBOOT": "reboot", "NVLINK_DOWN": "reboot", "PCIE_DOWNTRAINED": "reboot",
           "NIC_PORT_DOWN": "reboot", "NIC_COUNT": "reboot", "EFA_COUNT": "reboot", "EFA_NONE": "reboot",
           "NIC_AFFINITY": "warn", "FABRIC_NOT_READY": "reboot", "GPU_RUNTIME": "reboot"},
    checks={"gpu.count": "reboot", "dcgm.gpu_count": "reboot", "sxid": "reboot", "gpu.allocatable": "quarantine"},
    dcgm={"80": "replace", "84": "reboot", "85": "reboot", "6": "reboot", "4": "reboot", "14": "reboot",
          "120": "reboot", "125": "reboot", "126": "reboot", "128": "reboot", "29": "warn"},
    xid_actions=XID_ACTIONS))
