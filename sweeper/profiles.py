"""Per-instance-type hardware expectations, matched by instance type, then GPU product label,
then a conservative default that still checks what it can."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sweeper.errors import ConfigError

DEFAULT = "default"


@dataclass(frozen=True)
class Profile:
    name: str
    gpus: int
    gpu_model: str = ""
    instance_types: tuple[str, ...] = ()
    gpu_products: tuple[str, ...] = ()
    nccl_busbw_min: float | None = None  # GB/s, all-reduce on one node at the largest message
    source: str = ""


def load_profile(path: Path) -> Profile:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return _profile(raw, path)


def load_profiles(directory: Path) -> dict[str, Profile]:
    out: dict[str, Profile] = {}
    for path in sorted(directory.glob("*.yaml")):
        p = load_profile(path)
        out[p.name] = p
    if DEFAULT not in out:
        out[DEFAULT] = Profile(DEFAULT, gpus=8, source="built-in")
    return out


def _profile(raw: Any, path: Path) -> Profile:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a profile is a mapping")
    known = {"name", "gpus", "gpu_model", "instance_types", "gpu_products", "description", "nccl_busbw_min"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}")
    if not isinstance(raw.get("gpus"), int) or raw["gpus"] < 1:
        raise ConfigError(f"{path}: gpus must be a positive integer")
    return Profile(name=str(raw.get("name", path.stem)), gpus=raw["gpus"], gpu_model=str(raw.get("gpu_model", "")),
                   instance_types=tuple(raw.get("instance_types") or ()),
                   gpu_products=tuple(raw.get("gpu_products") or ()),
                   nccl_busbw_min=None if raw.get("nccl_busbw_min") is None else float(raw["nccl_busbw_min"]),
                   source=str(path))


def match(profiles: dict[str, Profile], labels: dict[str, str]) -> Profile:
    itype = labels.get("node.kubernetes.io/instance-type") or labels.get("beta.kubernetes.io/instance-type")
    product = labels.get("nvidia.com/gpu.product")
    for p in profiles.values():
        if itype and itype in p.instance_types:
            return p
    for p in profiles.values():
        if product and product in p.gpu_products:
            return p
    return profiles[DEFAULT]
