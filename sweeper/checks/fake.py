"""A fake NVML with the pynvml API and the exceptions of the real bindings, built from a
simulated node's hardware state. The simulated kubelet hands it to the real checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:18:00.0"
    uuid: str = ""
    temperature: int = 35
    persistence: bool = True
    ecc_supported: bool = True
    volatile_corrected: int = 0
    volatile_uncorrected: int = 0
    aggregate_corrected: int = 0
    aggregate_uncorrected: int = 0
    remap_supported: bool = True
    remapped_corrected: int = 0
    remapped_uncorrected: int = 0
    remap_pending: bool = False
    remap_failure: bool = False


@dataclass
class FakeNvml:
    """Answers the pynvml calls the checks make, from a list of FakeGpu."""

    gpus: list[FakeGpu] = field(default_factory=list)
    driver: str = "570.133.20"
    library_present: bool = True

    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported

    def nvmlInit(self) -> None:
        if not self.library_present:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid or f"GPU-{h.index:08x}-0000-0000-0000-000000000000"

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(busId=h.bus_id)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return h.temperature

    def nvmlDeviceGetPersistenceMode(self, h: FakeGpu) -> int:
        return 1 if h.persistence else 0

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter_type: int) -> int:
        if not h.ecc_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter_type == pynvml.NVML_VOLATILE_ECC:
            return h.volatile_corrected if corrected else h.volatile_uncorrected
        return h.aggregate_corrected if corrected else h.aggregate_uncorrected

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        if not h.remap_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (h.remapped_corrected, h.remapped_uncorrected, int(h.remap_pending), int(h.remap_failure))


H100_BUS_IDS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def bus_id(index: int) -> str:
    bus = H100_BUS_IDS[index] if index < len(H100_BUS_IDS) else f"{0x10 + index:02x}"
    return f"00000000:{bus.upper()}:00.0"


def xid_line(uptime: float, index: int, code: int, text: str) -> str:
    bus = bus_id(index).split(":")[1].lower()
    return f"[{uptime:12.6f}] NVRM: Xid (PCI:0000:{bus}:00): {code}, pid='<unknown>', name=<unknown>, {text}"
