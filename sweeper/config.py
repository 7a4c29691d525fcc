"""Sweeper's configuration: one YAML file, strict keys, every safety limit with a default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from sweeper.clock import parse_duration
from sweeper.errors import ConfigError


def home() -> Path:
    """Where playbooks/, job-templates/ and profiles/ live: $SWEEPER_HOME or the source tree."""
    env = os.environ.get("SWEEPER_HOME")
    return Path(env) if env else Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Config:
    namespace: str = "sweeper"
    prefix: str = "sweeper.dev"
    gpu_node_selector: str = "nvidia.com/gpu.present=true"
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
    gpu_resource_prefixes: tuple[str, ...] = ("nvidia.com/mig-",)
    allowed_taint_keys: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
    opt_out_label: str = "sweeper.dev/opt-out"
    max_nodes: int = 4
    max_percent: float = 10.0
    min_node_age: float = 600.0
    interval: float = 86400.0
    playbook: str = "sweep-light.yaml"
    check_image: str = "ghcr.io/sweeper-dev/sweeper:0.1.0"
    check_timeout: float = 900.0
    poll_interval: float = 5.0
    job_ttl: float = 3600.0
    page_size: int = 500
    api_attempts: int = 6
    min_healthy_nodes: int = 0  # never take a node if fewer schedulable healthy GPU nodes would remain
    min_healthy_percent: float = 0.0
    max_attempts: int = 3  # a node that failed this often within attempt_window waits for a person
    attempt_window: float = 7 * 86400.0
    breaker_failures: int = 5  # this many failing verdicts within breaker_window...
    breaker_percent: float = 20.0  # ...or this share of GPU nodes, whichever is larger, opens the breaker
    breaker_window: float = 3600.0
    breaker_cooldown: float = 3600.0  # after a reset, one node at a time for this long
    tool_error_limit: int = 3  # the same fault of the check on this many nodes stops the run (0: never)
    policy: str = "default.yaml"  # in policies/: how findings and history become a verdict
    light_playbook: str = "light-busy.yaml"  # read-only checks on busy nodes ("" to turn off)
    light_interval: float = 6 * 3600.0
    light_max: int = 20  # light checks per run
    yield_to_pending: bool = True  # take no node while GPU pods wait for capacity
    abort_on_demand: bool = False  # also stop running checks (abortable ones) and hand their nodes back
    max_replacements_per_hour: int = 2  # beyond this, a `replace` verdict becomes `quarantine` (a person decides)
    check_priority_class: str = ""  # a low PriorityClass for check pods, so the scheduler prefers workloads
    suspect_conditions: tuple[str, ...] = ("GpuXid", "GpuEcc", "GpuNvlink", "GpuCount")  # swept first when idle
    handled_conditions: tuple[str, ...] = ()  # another remediator owns a node with one of these set
    suspect_sources: tuple[dict[str, Any], ...] = ()  # [{type: prometheus|loki, url, query, node_label, window}]
    # Remediation: which provider acts on `replace` (karpenter, asg or manual), by node pool
    # (karpenter.sh/nodepool label), then by profile, then the default.
    remediation: dict[str, Any] = field(default_factory=lambda: {"default": "manual"})
    remediate_reboots: bool = False  # run the reboot (or GPU reset) Job for a `reboot` verdict (opt in)
    gpu_reset: bool = True  # a reset-able cause (pending remap, the driver's reset request) resets GPUs, not the node
    reboot_template: str = "reboot.yaml.j2"
    gpu_reset_template: str = "gpu-reset.yaml.j2"
    remediation_timeout: float = 1800.0  # a rebooted node not Ready again by then waits for a person
    replacement_wait: float = 900.0  # how long to follow Karpenter's termination of a replaced node
    asg_action: str = "set-unhealthy"  # or "terminate" (without decrementing the desired capacity)
    aws_region: str = ""  # else from the node's providerID zone
    webhook_url: str = ""  # Slack-compatible JSON on holds and replacements
    webhook_attempts: int = 4
    pushgateway_url: str = ""  # `sweeper sweep` pushes its metrics here when set
    node_condition: bool = False  # set the GpuSweepHealthy condition for Karpenter node repair, draino, medik8s
    schedules: tuple[dict[str, Any], ...] = ()  # `sweeper serve`: [{name, cron, playbook?, max_nodes?}]
    lock_name: str = "sweeper-lock"
    lock_ttl: float = 300.0  # seconds without renewal after which a dead sweeper's lock may be taken
    orphan_grace: float = 3600.0  # Sweeper's taint with no record in history is removed after this long
    playbook_dir: str = ""
    template_dir: str = ""
    profile_dir: str = ""
    policy_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def taint_key(self) -> str:
        return f"{self.prefix}/sweep"

    def path(self, kind: str) -> Path:
        explicit = {"playbooks": self.playbook_dir, "job-templates": self.template_dir,
                    "profiles": self.profile_dir, "policies": self.policy_dir}[kind]
        return Path(explicit) if explicit else home() / kind

    def with_overrides(self, **kw: Any) -> Config:
        return replace(self, **{k: v for k, v in kw.items() if v is not None})


_DURATIONS = {"remediation_timeout", "replacement_wait", "min_node_age", "interval", "check_timeout", "poll_interval", "job_ttl", "lock_ttl", "orphan_grace",
              "attempt_window", "breaker_window", "breaker_cooldown", "light_interval"}


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {p}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the configuration must be a mapping")
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{p}: unknown key(s) {unknown}; known keys: {sorted(known - {'extra'})}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _DURATIONS:
            try:
                value = parse_duration(value)
            except ValueError as exc:
                raise ConfigError(f"{p}: {key}: not a duration: {value!r}") from exc
        elif key in ("suspect_sources", "schedules"):
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ConfigError(f"{p}: {key}: expected a list of mappings")
            value = tuple(value)
        elif key == "remediation":
            value = _remediation(value, p)
        elif isinstance(getattr(Config, key, None), tuple) or key in ("gpu_resources", "allowed_taint_keys",
                                                                      "gpu_resource_prefixes", "suspect_conditions",
                                                                      "handled_conditions"):
            if not isinstance(value, list):
                raise ConfigError(f"{p}: {key}: expected a list")
            value = tuple(str(v) for v in value)
        values[key] = value
    cfg = Config(**values)
    if cfg.asg_action not in ("set-unhealthy", "terminate"):
        raise ConfigError(f"{p}: asg_action must be set-unhealthy or terminate")
    for i, sch in enumerate(cfg.schedules):
        if not sch.get("name") or not sch.get("cron"):
            raise ConfigError(f"{p}: schedules[{i}]: a schedule needs a name and a cron expression")
        extra = set(sch) - {"name", "cron", "playbook", "max_nodes", "interval"}
        if extra:
            raise ConfigError(f"{p}: schedules[{i}]: unknown key(s) {sorted(extra)}")
    if cfg.max_nodes < 0 or not 0 <= cfg.max_percent <= 100:
        raise ConfigError(f"{p}: max_nodes must be >= 0 and max_percent within 0..100")
    return cfg


PROVIDERS = ("karpenter", "asg", "manual")


def _remediation(value: Any, p: Path) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) - {"default", "by_pool", "by_profile"}:
        raise ConfigError(f"{p}: remediation: a mapping of default, by_pool and by_profile")
    out: dict[str, Any] = {"default": value.get("default", "manual"), "by_pool": dict(value.get("by_pool") or {}),
                           "by_profile": dict(value.get("by_profile") or {})}
    for where, provider in [("default", out["default"])] + [(f"by_pool.{k}", v) for k, v in out["by_pool"].items()] \
            + [(f"by_profile.{k}", v) for k, v in out["by_profile"].items()]:
        if provider not in PROVIDERS:
            raise ConfigError(f"{p}: remediation.{where}: {provider!r} is not one of {', '.join(PROVIDERS)}")
    return out
