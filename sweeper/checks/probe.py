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
        return {name: _plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [_plain(v) for v in value]
    return repr(value)


def _call(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"ok": _plain(fn(*args))}
    except pynvml.NVMLError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def _gpu(h: Any) -> dict[str, Any]:
    unc, cor = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    out: dict[str, Any] = {
        "name": _call(pynvml.nvmlDeviceGetName, h),
        "pci": _call(pynvml.nvmlDeviceGetPciInfo, h),
        "memory": _call(pynvml.nvmlDeviceGetMemoryInfo, h),
        "persistence": _call(pynvml.nvmlDeviceGetPersistenceMode, h),
        "ecc_volatile_uncorrected": _call(pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_VOLATILE_ECC),
        "ecc_aggregate_corrected": _call(pynvml.nvmlDeviceGetTotalEccErrors, h, cor, pynvml.NVML_AGGREGATE_ECC),
        "ecc_aggregate_uncorrected": _call(pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_AGGREGATE_ECC),
        "remapped_rows": _call(pynvml.nvmlDeviceGetRemappedRows, h),
        "retired_pages_sbe": _call(pynvml.nvmlDeviceGetRetiredPages, h, 0),
        "retired_pages_dbe": _call(pynvml.nvmlDeviceGetRetiredPages, h, 1),
        "retired_pages_pending": _call(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h),
        "pcie_width": _call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_max_width": _call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
        "pcie_gen": _call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_max_gen": _call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_replay": _call(pynvml.nvmlDeviceGetPcieReplayCounter, h),
        "clock_events": _call(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                              or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h),
        "temperature": _call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
        "margin_temperature": _call(pynvml.nvmlDeviceGetMarginTemperature, h),
        "power": _call(pynvml.nvmlDeviceGetPowerUsage, h),
        "power_limit": _call(pynvml.nvmlDeviceGetEnforcedPowerLimit, h),
        "vbios": _call(pynvml.nvmlDeviceGetVbiosVersion, h),
        "serial": _call(pynvml.nvmlDeviceGetSerial, h),
        "board_part_number": _call(pynvml.nvmlDeviceGetBoardPartNumber, h),
        "uuid": _call(pynvml.nvmlDeviceGetUUID, h),
    }
    fields = _call(pynvml.nvmlDeviceGetFieldValues, h, [FIELD_RECOVERY_ACTION])
    out["field_recovery_action"] = fields
    links = []
    for link in range(MAX_LINKS_PROBED):
        state = _call(pynvml.nvmlDeviceGetNvLinkState, h, link)
        entry: dict[str, Any] = {"link": link, "state": state}
        if state.get("ok") == pynvml.NVML_FEATURE_ENABLED:
            for label, counter in (("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
                                   ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                                   ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                                   ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)):
                entry[label] = _call(pynvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
        links.append(entry)
        if "error" in state:
            break
    out["nvlink"] = links
    struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if struct is not None and hasattr(pynvml, "nvmlDeviceGetGpuFabricInfo"):
        info = struct()
        got = _call(pynvml.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info))
        out["fabric"] = {**got, "info": _plain(info)} if "ok" in got else got
    return out


def probe() -> dict[str, Any]:
    """The whole record: the bindings' version, the driver, and each GPU's readings."""
    record: dict[str, Any] = {"bindings": getattr(pynvml, "__version__", ""), "init": _call(pynvml.nvmlInit)}
    if "error" in record["init"]:
        return record
    try:
        record["driver"] = _call(pynvml.nvmlSystemGetDriverVersion)
        record["nvml_version"] = _call(pynvml.nvmlSystemGetNVMLVersion)
        record["cuda_driver_version"] = _call(pynvml.nvmlSystemGetCudaDriverVersion)
        count = _call(pynvml.nvmlDeviceGetCount)
        record["count"] = count
        record["gpus"] = [_gpu(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(int(count.get("ok", 0)))]
    finally:
        pynvml.nvmlShutdown()
    return record


def main() -> int:
    json.dump(probe(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
