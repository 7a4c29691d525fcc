"""The NVIDIA driver a node runs, and the CUDA major its branch runs: what picks the DCGM build
(config `dcgm_images`) for a node.

A driver runs every CUDA release of the majors its branch supports (CUDA minor version
compatibility): CUDA 13.x needs a driver of branch 580 or later, CUDA 12.x of branch 525 or later,
CUDA 11.x of branch 450 or later (CUDA 13.0 GA asks for >= 580.65.06, 12.0 GA for >= 525.60.13).
https://docs.nvidia.com/deploy/cuda-compatibility/ ,
https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#cuda-driver

GPU Feature Discovery (the GPU Operator's GFD) labels a node with both: the CUDA major its driver
runs (`nvidia.com/cuda.runtime-version.major`, formerly `nvidia.com/cuda.runtime.major`, from NVML's
CUDA driver version) and the driver's own major (`nvidia.com/cuda.driver-version.major`, formerly
`nvidia.com/cuda.driver.major`). NVIDIA/k8s-device-plugin: internal/lm/nvml.go, newVersionLabeler;
docs/gpu-feature-discovery/README.md."""

from __future__ import annotations

import re
from collections.abc import Mapping

# (the first driver branch, the CUDA major it runs), newest first.
CUDA_BY_BRANCH = ((580, 13), (525, 12), (450, 11))
CUDA_LABELS = ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime.major")
DRIVER_LABELS = ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major")
_VERSION = re.compile(r"^\s*(\d{3,4})(?:\.\d+){1,2}\s*$")


def cuda_of_branch(branch: int) -> int | None:
    """The CUDA major a driver branch (its version's major, e.g. 570) runs; None before 450."""
    return next((cuda for first, cuda in CUDA_BY_BRANCH if branch >= first), None)


def branch_of(version: str) -> int | None:
    """The branch of a driver version as NVML prints it ("570.133.20", "580.65"); None if it is not one."""
    m = _VERSION.match(version or "")
    return int(m.group(1)) if m else None


def _int_label(labels: Mapping[str, str], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = str(labels.get(key, "")).strip()
        if value.isdigit():
            return int(value)
    return None


def node_cuda_major(labels: Mapping[str, str], driver_version: str | None = None) -> tuple[int | None, str]:
    """The CUDA major the node's driver runs and where it was read: GFD's CUDA label, else GFD's
    driver label, else the driver version Sweeper's own node check last recorded; (None, "") if none."""
    cuda = _int_label(labels, CUDA_LABELS)
    if cuda:
        return cuda, "label"
    branch = _int_label(labels, DRIVER_LABELS)
    if branch and cuda_of_branch(branch):
        return cuda_of_branch(branch), "driver label"
    branch = branch_of(driver_version or "")
    if branch and cuda_of_branch(branch):
        return cuda_of_branch(branch), "history"
    return None, ""
