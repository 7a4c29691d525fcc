"""What every node-local check shares: the collector of findings and metrics, and one way to
call NVML that tells a missing feature from a failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sweeper.result import CheckResult, Metric


class Collector:
    def __init__(self) -> None:
        self.checks: list[CheckResult] = []
        self.metrics: list[Metric] = []
        self.facts: dict[str, str] = {}  # the node's hardware and software as read (sweeper.checks.facts)

    def check(self, name: str, status: str, message: str = "", severity: str = "info",
              gpu: int | None = None, code: str | None = None) -> None:
        self.checks.append(CheckResult(name, status, message, severity, gpu, code))

    def fact(self, key: str, value: str) -> None:
        self.facts[key] = value

    def metric(self, name: str, value: float, unit: str = "", gpu: int | None = None) -> None:
        self.metrics.append(Metric(name, float(value), unit, gpu))


class GpuLost(Exception):
    """NVML says the GPU is lost or needs a reset: no further reading of it means anything."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def nvml_call(nvml: Any, fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """('ok', value), ('unsupported', why) or ('error', message); raises GpuLost. A reading NVML
    refuses for want of privilege is 'unsupported' with that reason: a skip, never a pass."""
    try:
        return "ok", fn(*args)
    except nvml.NVMLError_NotSupported:
        return "unsupported", "not supported on this GPU"
    except nvml.NVMLError_FunctionNotFound:
        return "unsupported", "the driver lacks this call"
    except nvml.NVMLError_NoPermission:  # an unprivileged check (the light one): no reading, never a pass
        return "unsupported", "NVML refuses it to an unprivileged check (insufficient permissions)"
    except nvml.NVMLError_GpuIsLost as exc:
        raise GpuLost("GPU_LOST", f"NVML: {exc}") from exc
    except nvml.NVMLError_ResetRequired as exc:
        raise GpuLost("RESET_REQUIRED", f"NVML: {exc}") from exc
    except nvml.NVMLError as exc:
        return "error", str(exc)
