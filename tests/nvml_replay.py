"""An NVML that answers from a probe record (`python -m sweeper.checks.probe` on a real GPU), so the
node checks can be run on what a real GPU said: each call returns the recorded value, or raises the
recorded NVMLError class. A call the record does not hold raises NVMLError_NotSupported's sibling
NVMLError_FunctionNotFound, which the checks read as a skip, never a pass."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml


class RecordedNvml:
    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        for name in dir(pynvml):  # constants and error classes as the bindings name them
            if name.startswith(("NVML_", "NVMLError")):
                setattr(self, name, getattr(pynvml, name))

    def _answer(self, entry: dict[str, Any] | None) -> Any:
        if entry is None:
            raise pynvml.NVMLError_FunctionNotFound()
        if "error" in entry:
            raise getattr(pynvml, entry["error"])()
        return entry["ok"]

    def _gpu(self, h: int, key: str) -> Any:
        return self._answer(self.record["gpus"][h].get(key))

    # -- system -------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._answer(self.record["init"])

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._answer(self.record.get("driver")))

    def nvmlDeviceGetCount(self) -> int:
        return int(self._answer(self.record.get("count")))

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i >= len(self.record["gpus"]):
            raise pynvml.NVMLError_InvalidArgument()
        return i

    # -- one GPU ------------------------------------------------------------------------------
    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        pci = self._gpu(h, "pci")
        info = pynvml.nvmlPciInfo_t()
        info.busId = pci["busId"].encode()
        return info

    def nvmlDeviceGetName(self, h: int) -> str:
        return str(self._gpu(h, "name"))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        mem = self._gpu(h, "memory")
        info = pynvml.c_nvmlMemory_t()
        info.total, info.free, info.used = mem["total"], mem["free"], mem["used"]
        return info

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return int(self._gpu(h, "persistence"))

    def nvmlDeviceGetTotalEccErrors(self, h: int, etype: int, counter: int) -> int:
        if counter == pynvml.NVML_VOLATILE_ECC:
            return int(self._gpu(h, "ecc_volatile_uncorrected"))
        key = "ecc_aggregate_uncorrected" if etype == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "ecc_aggregate_corrected"
        return int(self._gpu(h, key))

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, ...]:
        return tuple(self._gpu(h, "remapped_rows"))

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        return list(self._gpu(h, "retired_pages_dbe" if cause else "retired_pages_sbe"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return int(self._gpu(h, "retired_pages_pending"))

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        links = self.record["gpus"][h].get("nvlink") or []
        entry = next((e for e in links if e["link"] == link), None)
        if entry is None:
            raise pynvml.NVMLError_InvalidArgument()
        return int(self._answer(entry["state"]))

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        raise pynvml.NVMLError_FunctionNotFound()  # the record holds no link that was up

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return int(self._gpu(h, "pcie_width"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return int(self._gpu(h, "pcie_max_width"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return int(self._gpu(h, "pcie_gen"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return int(self._gpu(h, "pcie_max_gen"))

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return int(self._gpu(h, "pcie_replay"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._gpu(h, "clock_events"))

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return int(self._gpu(h, "temperature"))

    def nvmlDeviceGetMarginTemperature(self, h: int) -> int:
        return int(self._gpu(h, "margin_temperature"))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._gpu(h, "power"))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return int(self._gpu(h, "power_limit"))

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[int]) -> list[Any]:
        out = []
        for want, got in zip(fields, self._gpu(h, "field_recovery_action"), strict=True):
            v = pynvml.c_nvmlFieldValue_t()
            v.fieldId, v.nvmlReturn, v.valueType = want, got["nvmlReturn"], got["valueType"]
            for member, value in got["value"].items():
                setattr(v.value, member, value)
            out.append(v)
        return out

    def nvmlDeviceGetGpuFabricInfo(self, h: int, ref: Any) -> None:
        fabric = self.record["gpus"][h].get("fabric")
        self._answer(fabric)
        info = ctypes.cast(ref, ctypes.POINTER(pynvml.c_nvmlGpuFabricInfo_t)).contents
        info.state, info.status = fabric["info"]["state"], fabric["info"]["status"]
