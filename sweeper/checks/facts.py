"""The node's hardware and software facts as NVML reads them (driver, CUDA driver version, each
GPU's VBIOS, serial and board part number), for reading failures by cohort (`sweeper cohorts`).
A fact NVML cannot read is left out, never guessed; facts are data, never a verdict."""

from __future__ import annotations

from typing import Any

from sweeper.checks.collect import Collector


def _read(nvml: Any, fn: str, *args: Any) -> str | None:
    try:
        value = getattr(nvml, fn)(*args)
    except (nvml.NVMLError, AttributeError):
        return None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return str(value).strip() or None


def cuda_version(value: int) -> str:
    """nvmlSystemGetCudaDriverVersion's integer (1000 * major + 10 * minor) as `major.minor`."""
    return f"{value // 1000}.{value % 1000 // 10}"


def system_facts(nvml: Any, c: Collector) -> None:
    """The driver version and the CUDA version the driver supports."""
    driver = _read(nvml, "nvmlSystemGetDriverVersion")
    if driver:
        c.fact("driver", driver)
    cuda = _read(nvml, "nvmlSystemGetCudaDriverVersion")
    if cuda and cuda.isdigit():
        c.fact("cuda", cuda_version(int(cuda)))


def gpu_facts(nvml: Any, h: Any, i: int, c: Collector) -> None:
    """One GPU's VBIOS, serial and board part number: per GPU (`gpu.N.*`), and the node's distinct
    values joined by commas (`vbios`, `board`), the cohort keys."""
    for key, fn in (("vbios", "nvmlDeviceGetVbiosVersion"), ("serial", "nvmlDeviceGetSerial"),
                    ("board", "nvmlDeviceGetBoardPartNumber")):
        value = _read(nvml, fn, h)
        if value is None:
            continue
        c.fact(f"gpu.{i}.{key}", value)
        if key != "serial":
            seen = set(filter(None, c.facts.get(key, "").split(",")))
            c.fact(key, ",".join(sorted(seen | {value})))
