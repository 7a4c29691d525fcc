"""Every NVML reading the GPU checks make, recorded as it came back: the value, or the class of
the NVML error. Run on a real GPU node (`python -m sweeper.checks.probe > probe.json`) it gives
the fixture that the fake NVML is held to: which readings a GPU model supports, which it
refuses, and the shape of each value. It reads only; it changes nothing on the GPU."""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

import pynvml

from sweeper.checks.gpu import FIELD_RECOVERY_ACTION

MAX_LINKS_PROBED = 18  # NVML_NVLINK_MAX_LINKS on R535 and later


def _plain(value: Any) -> Any:
    """A JSON-able form of what an NVML call returned."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        # A union (c_nvmlValue_t, the value of a field) prints every member: which one holds the
        # value is the field's valueType (1: uiVal, unsigned int).
        return {name: _plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [_plain(v) for v in value]
    return repr(value)


def _call(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"ok": _plain(fn(*args))}
    except pynvml.NVMLError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def _gpu(nvml: Any, h: Any) -> dict[str, Any]:
    unc, cor = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    out: dict[str, Any] = {
        "name": _call(nvml.nvmlDeviceGetName, h),
        "pci": _call(nvml.nvmlDeviceGetPciInfo, h),
        "memory": _call(nvml.nvmlDeviceGetMemoryInfo, h),
        "persistence": _call(nvml.nvmlDeviceGetPersistenceMode, h),
        "ecc_volatile_uncorrected": _call(nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_VOLATILE_ECC),
        "ecc_aggregate_corrected": _call(nvml.nvmlDeviceGetTotalEccErrors, h, cor, nvml.NVML_AGGREGATE_ECC),
        "ecc_aggregate_uncorrected": _call(nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_AGGREGATE_ECC),
        "remapped_rows": _call(nvml.nvmlDeviceGetRemappedRows, h),
        "retired_pages_sbe": _call(nvml.nvmlDeviceGetRetiredPages, h, 0),
        "retired_pages_dbe": _call(nvml.nvmlDeviceGetRetiredPages, h, 1),
        "retired_pages_pending": _call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h),
        "pcie_width": _call(nvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_max_width": _call(nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        "pcie_gen": _call(nvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_max_gen": _call(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_replay": _call(nvml.nvmlDeviceGetPcieReplayCounter, h),
        "clock_events": _call(getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                              or nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h),
        "temperature": _call(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
        "margin_temperature": _call(nvml.nvmlDeviceGetMarginTemperature, h),
        "power": _call(nvml.nvmlDeviceGetPowerUsage, h),
        "power_limit": _call(nvml.nvmlDeviceGetEnforcedPowerLimit, h),
        "vbios": _call(nvml.nvmlDeviceGetVbiosVersion, h),
        "serial": _call(nvml.nvmlDeviceGetSerial, h),
        "board_part_number": _call(nvml.nvmlDeviceGetBoardPartNumber, h),
        "uuid": _call(nvml.nvmlDeviceGetUUID, h),
    }
    fields = _call(nvml.nvmlDeviceGetFieldValues, h, [FIELD_RECOVERY_ACTION])
    out["field_recovery_action"] = fields
    links = []
    for link in range(MAX_LINKS_PROBED):
        state = _call(nvml.nvmlDeviceGetNvLinkState, h, link)
        entry: dict[str, Any] = {"link": link, "state": state}
        if state.get("ok") == nvml.NVML_FEATURE_ENABLED:
            for label, counter in (("replay", nvml.NVML_NVLINK_ERROR_DL_REPLAY),
                                   ("recovery", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                                   ("crc_flit", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                                   ("crc_data", nvml.NVML_NVLINK_ERROR_DL_CRC_DATA)):
                entry[label] = _call(nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
        links.append(entry)
        if "error" in state:
            break
    out["nvlink"] = links
    struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is not None and hasattr(nvml, "nvmlDeviceGetGpuFabricInfo"):
        info = struct()
        got = _call(nvml.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info))
        out["fabric"] = {**got, "info": _plain(info)} if "ok" in got else got
    return out


def probe(nvml: Any = pynvml) -> dict[str, Any]:
    """The whole record: the bindings' version, the driver, and each GPU's readings, read through
    `nvml` (the real bindings; the tests pass the fake NVML to hold it to a real GPU's record)."""
    record: dict[str, Any] = {"bindings": getattr(pynvml, "__version__", ""), "init": _call(nvml.nvmlInit)}
    if "error" in record["init"]:
        return record
    try:
        record["driver"] = _call(nvml.nvmlSystemGetDriverVersion)
        record["nvml_version"] = _call(nvml.nvmlSystemGetNVMLVersion)
        record["cuda_driver_version"] = _call(nvml.nvmlSystemGetCudaDriverVersion)
        count = _call(nvml.nvmlDeviceGetCount)
        record["count"] = count
        record["gpus"] = [_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(int(count.get("ok", 0)))]
    finally:
        nvml.nvmlShutdown()
    return record


def main() -> int:
    json.dump(probe(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
