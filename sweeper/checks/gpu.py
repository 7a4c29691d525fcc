"""The GPU checks, through NVML: count and model, driver, persistence, ECC, row remapping and
retired pages, NVLink, PCIe, clock events, thermal margin, power and the driver's recovery
action. Readings a GPU does not support are `skip` with the reason; failures to read are
`error`; a GPU that NVML reports lost fails the node."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from sweeper.checks.collect import Collector, GpuLost, nvml_call
from sweeper.checks.facts import gpu_facts, system_facts
from sweeper.checks.options import CheckOptions
from sweeper.parsers.kernel_log import normalise_pci
from sweeper.parsers.nvidia_smi import RECOVERY, recovery_verdict  # noqa: F401 (RECOVERY: kept importable here)

# Clock event bits worth a warning (GpuIdle and SwPowerCap are normal).
CLOCK_ALERTS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                0x80: "HW power brake"}
FIELD_RECOVERY_ACTION = 230
RETIRED_PAGES_LIMIT = 60
# Why a pod that requests no GPU may see none: the runtime, not the node. NVIDIA's runtime (RuntimeClass
# `nvidia`, or containerd's default on EKS and AKS GPU images) exposes every GPU for NVIDIA_VISIBLE_DEVICES=all;
# GKE's device plugin exposes GPUs only to pods that request them.
NO_REQUEST = ("the pod requests no GPU and its runtime exposed none (NVIDIA_VISIBLE_DEVICES=all needs NVIDIA's "
              "container runtime: config runtime_class; GKE gives devices only to pods that request GPUs), so "
              "this check cannot read the node")
_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def gpu_checks(opts: CheckOptions, nvml: Any, c: Collector, uptime: float | None) -> dict[str, int]:
    """Every GPU check; returns the GPUs' PCI addresses (normalised) to their index."""
    unrequested = opts.gpu_request == "none"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        c.check("nvml.init", "error", f"NVML could not be initialised: {exc}" + (f"; {NO_REQUEST}" if unrequested
                                                                                else ""), "critical")
        return {}
    bus_to_gpu: dict[str, int] = {}
    try:
        state, count = nvml_call(nvml, nvml.nvmlDeviceGetCount)
        if state != "ok":
            c.check("gpu.count", "error", f"cannot count GPUs: {count}", "critical")
            return {}
        c.metric("gpu.count", count)
        if count == 0 and unrequested and opts.expect_gpus:
            c.check("gpu.count", "error", f"this container sees no GPU: {NO_REQUEST}", "critical")
            return {}
        if count != opts.expect_gpus:
            c.check("gpu.count", "fail", f"{count} GPUs visible, the profile expects {opts.expect_gpus}",
                    "critical")
        else:
            c.check("gpu.count", "pass", f"{count} GPUs")
        system_facts(nvml, c)
        state, driver = nvml_call(nvml, nvml.nvmlSystemGetDriverVersion)
        if state == "ok":
            c.check("driver.version", "pass", str(driver))
        else:
            c.check("driver.version", "error", f"cannot read the driver version: {driver}", "warning")
        for i in range(count):
            try:
                state, h = nvml_call(nvml, nvml.nvmlDeviceGetHandleByIndex, i)
                if state != "ok":
                    c.check("gpu.handle", "fail", f"GPU {i} does not answer: {h}", "critical", gpu=i)
                    continue
                one_gpu(opts, nvml, h, i, c, bus_to_gpu, uptime)
                gpu_facts(nvml, h, i, c)
            except GpuLost as exc:
                c.check("gpu.lost", "fail", str(exc), "critical", gpu=i, code=exc.code)
    except GpuLost as exc:
        c.check("gpu.lost", "fail", str(exc), "critical", code=exc.code)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    return bus_to_gpu


def one_gpu(opts: CheckOptions, nvml: Any, h: Any, i: int, c: Collector, bus_to_gpu: dict[str, int],
            uptime: float | None) -> None:
    state, pci = nvml_call(nvml, nvml.nvmlDeviceGetPciInfo, h)
    if state == "ok":
        bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
        bus_to_gpu[normalise_pci(bus)] = i
    state, name = nvml_call(nvml, nvml.nvmlDeviceGetName, h)
    if state != "ok":
        c.check("gpu.model", "error", f"cannot read the model: {name}", "warning", gpu=i)
    elif opts.gpu_model and opts.gpu_model.lower() not in str(name).lower():
        c.check("gpu.model", "fail", f"model {name!r}, the profile expects {opts.gpu_model!r}", "critical", gpu=i)
    else:
        c.check("gpu.model", "pass", str(name), gpu=i)
    if opts.gpu_memory_gb:
        _memory(opts, nvml, h, i, c)
    state, mode = nvml_call(nvml, nvml.nvmlDeviceGetPersistenceMode, h)
    if state == "ok":
        if mode:
            c.check("gpu.persistence", "pass", "persistence mode on", gpu=i)
        else:
            c.check("gpu.persistence", "warn", "persistence mode off: the driver reloads between jobs", "warning",
                    gpu=i)
    else:
        c.check("gpu.persistence", "skip" if state == "unsupported" else "error", f"persistence mode: {mode}",
                gpu=i)
    _ecc(nvml, h, i, c)
    remap_supported = _remap(nvml, h, i, c)
    if not remap_supported:
        _retired_pages(nvml, h, i, c)
    _nvlink(opts, nvml, h, i, c)
    _pcie(opts, nvml, h, i, c, uptime)
    _clocks(nvml, h, i, c)
    _thermal_power(opts, nvml, h, i, c)
    _recovery(nvml, h, i, c)
    _fabric(nvml, h, i, c)


def _memory(opts: CheckOptions, nvml: Any, h: Any, i: int, c: Collector) -> None:
    """Total framebuffer memory against the profile: a GPU that comes up with less (a wrong SKU,
    memory taken out of service) fails."""
    state, info = nvml_call(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
    if _unread(c, "gpu.memory", state, info, "the memory size", i):
        return
    gib = info.total / 2**30
    c.metric("gpu.memory_total", gib, "GiB", gpu=i)
    if gib < 0.9 * opts.gpu_memory_gb:
        c.check("gpu.memory", "fail", f"{gib:.1f} GiB of memory, the profile expects {opts.gpu_memory_gb:g} GB",
                "critical", gpu=i, code="GPU_MEMORY")
    else:
        c.check("gpu.memory", "pass", f"{gib:.1f} GiB", gpu=i)


def _unread(c: Collector, name: str, state: str, value: Any, what: str, gpu: int) -> bool:
    """Record a reading that did not come back (skip when unsupported, else error); True if so."""
    if state == "unsupported":
        c.check(name, "skip", f"{what}: {value}", gpu=gpu)
        return True
    if state == "error":
        c.check(name, "error", f"cannot read {what}: {value}", "warning", gpu=gpu)
        return True
    return False


def _ecc(nvml: Any, h: Any, i: int, c: Collector) -> None:
    unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    cor = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    state, dbe = nvml_call(nvml, nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_VOLATILE_ECC)
    if _unread(c, "ecc.volatile_uncorrected", state, dbe, "ECC counters", i):
        return
    if dbe > 0:
        c.check("ecc.volatile_uncorrected", "fail", f"{dbe} volatile uncorrectable ECC errors", "critical",
                gpu=i, code="DBE")
    else:
        c.check("ecc.volatile_uncorrected", "pass", "no volatile uncorrectable ECC errors", gpu=i)
    for label, etype in (("corrected", cor), ("uncorrected", unc)):
        state, value = nvml_call(nvml, nvml.nvmlDeviceGetTotalEccErrors, h, etype, nvml.NVML_AGGREGATE_ECC)
        if state == "ok":
            c.metric(f"ecc.aggregate_{label}", value, "count", gpu=i)


def _remap(nvml: Any, h: Any, i: int, c: Collector) -> bool:
    state, rows = nvml_call(nvml, nvml.nvmlDeviceGetRemappedRows, h)
    if _unread(c, "row_remap", state, rows, "row remapping", i):
        return state != "unsupported"
    corrected, uncorrected, pending, failure = rows
    c.metric("row_remap.corrected", corrected, "rows", gpu=i)
    c.metric("row_remap.uncorrected", uncorrected, "rows", gpu=i)
    if failure:
        c.check("row_remap", "fail", "row remapping failure: the GPU is an RMA candidate", "fatal", gpu=i,
                code="REMAP_FAILURE")
    elif pending:
        c.check("row_remap", "fail", "row remapping pending: the GPU needs a reset", "critical", gpu=i,
                code="REMAP_PENDING")
    else:
        c.check("row_remap", "pass", f"{corrected + uncorrected} rows remapped, none pending", gpu=i)
    return True


def _retired_pages(nvml: Any, h: Any, i: int, c: Collector) -> None:
    """Page retirement, which row remapping replaced on Ampere and later."""
    total = 0
    for cause in (0, 1):  # multiple single-bit errors, double-bit error
        state, pages = nvml_call(nvml, nvml.nvmlDeviceGetRetiredPages, h, cause)
        if _unread(c, "retired_pages", state, pages, "page retirement", i):
            return
        total += len(pages)
    c.metric("retired_pages", total, "pages", gpu=i)
    state, pending = nvml_call(nvml, nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if total >= RETIRED_PAGES_LIMIT:
        c.check("retired_pages", "fail", f"{total} retired pages (limit {RETIRED_PAGES_LIMIT})", "fatal", gpu=i,
                code="RETIRED_PAGES")
    elif state == "ok" and pending:
        c.check("retired_pages", "fail", "page retirement pending: the GPU needs a reset", "critical", gpu=i,
                code="RETIRE_PENDING")
    else:
        c.check("retired_pages", "pass", f"{total} retired pages", gpu=i)


def _nvlink(opts: CheckOptions, nvml: Any, h: Any, i: int, c: Collector) -> None:
    if opts.expect_nvlinks == 0:
        return
    limit = opts.expect_nvlinks if opts.expect_nvlinks > 0 else nvml.NVML_NVLINK_MAX_LINKS
    active, down = 0, []
    errors = {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    counters = (("replay", nvml.NVML_NVLINK_ERROR_DL_REPLAY), ("recovery", nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                ("crc_flit", nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT), ("crc_data", nvml.NVML_NVLINK_ERROR_DL_CRC_DATA))
    counted = False
    for link in range(limit):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(h, link)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            if link == 0:
                if opts.expect_nvlinks > 0:
                    c.check("nvlink.state", "fail", f"no NVLink answers, the profile expects {opts.expect_nvlinks} "
                            "links", "critical", gpu=i, code="NVLINK_DOWN")
                else:
                    c.check("nvlink.state", "skip", "this GPU has no NVLink", gpu=i)
                return
            if opts.expect_nvlinks > 0:
                down.append(link)
                continue
            break
        except nvml.NVMLError as exc:
            c.check("nvlink.state", "error", f"cannot read NVLink {link}: {exc}", "warning", gpu=i)
            return
        if state != nvml.NVML_FEATURE_ENABLED:
            down.append(link)
            continue
        active += 1
        for label, counter in counters:
            st, value = nvml_call(nvml, nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if st == "ok":
                errors[label] += int(value)
                counted = True
    c.metric("nvlink.active", active, "links", gpu=i)
    if down:
        c.check("nvlink.state", "fail", f"{len(down)} NVLink link(s) inactive: {down[:8]}; {active} active",
                "critical", gpu=i, code="NVLINK_DOWN")
    else:
        c.check("nvlink.state", "pass", f"{active} links active", gpu=i)
    if counted:
        for label, value in errors.items():
            c.metric(f"nvlink.{label}", value, "count", gpu=i)
        if errors["replay"] or errors["recovery"]:
            c.check("nvlink.errors", "warn", f"replay {errors['replay']}, recovery {errors['recovery']}, CRC "
                    f"{errors['crc_flit'] + errors['crc_data']} since the counters were reset", "warning", gpu=i)
        else:
            c.check("nvlink.errors", "pass", f"no replay or recovery; CRC {errors['crc_flit'] + errors['crc_data']}",
                    gpu=i)


def _pcie(opts: CheckOptions, nvml: Any, h: Any, i: int, c: Collector, uptime: float | None) -> None:
    st_w, width = nvml_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, h)
    st_mw, max_width = nvml_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, h)
    st_g, gen = nvml_call(nvml, nvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
    st_mg, max_gen = nvml_call(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
    if st_w != "ok" or st_mw != "ok":
        c.check("pcie.link", "skip" if "unsupported" in (st_w, st_mw) else "error",
                f"cannot read the PCIe link width: {width if st_w != 'ok' else max_width}", gpu=i)
    else:
        want_width = opts.pcie_width or max_width
        want_gen = opts.pcie_gen
        c.metric("pcie.width", width, "lanes", gpu=i)
        if st_g == "ok":
            c.metric("pcie.gen", gen, "", gpu=i)
        # The link drops to a lower generation at idle to save power: compare the width now,
        # and the generation the link can reach, not the one it runs at.
        problems = []
        if width < want_width:
            problems.append(f"x{width} of x{want_width}")
        if want_gen and st_mg == "ok" and max_gen < want_gen:
            problems.append(f"gen {max_gen} at most, the profile expects gen {want_gen}")
        if problems:
            c.check("pcie.link", "fail", "PCIe link downtrained: " + "; ".join(problems), "critical", gpu=i,
                    code="PCIE_DOWNTRAINED")
        else:
            c.check("pcie.link", "pass", f"x{width}" + (f", gen {gen} now (max {max_gen})" if st_g == "ok"
                                                        and st_mg == "ok" else ""), gpu=i)
    st, replays = nvml_call(nvml, nvml.nvmlDeviceGetPcieReplayCounter, h)
    if st != "ok":
        return
    c.metric("pcie.replay", replays, "count", gpu=i)
    if uptime and uptime > 0:
        rate = replays / (uptime / 60.0)
        if rate > opts.pcie_replay_per_min:
            c.check("pcie.replay", "fail", f"{replays} PCIe replays since boot, {rate:.1f}/min (limit "
                    f"{opts.pcie_replay_per_min:g}/min)", "critical", gpu=i, code="PCIE_REPLAY")
        else:
            c.check("pcie.replay", "pass", f"{replays} replays since boot", gpu=i)


def _clocks(nvml: Any, h: Any, i: int, c: Collector) -> None:
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    st, mask = nvml_call(nvml, fn, h)
    if st != "ok":
        c.check("clocks.events", "skip" if st == "unsupported" else "error", f"clock event reasons: {mask}", gpu=i)
        return
    active = [label for bit, label in CLOCK_ALERTS.items() if mask & bit]
    if active:
        c.check("clocks.events", "warn", "clocks held down: " + ", ".join(active) + f" (0x{mask:x})", "warning", gpu=i)
    else:
        c.check("clocks.events", "pass", f"no slowdown (0x{mask:x})", gpu=i)


def _thermal_power(opts: CheckOptions, nvml: Any, h: Any, i: int, c: Collector) -> None:
    st, temp = nvml_call(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    if st == "ok":
        c.metric("gpu.temperature", temp, "C", gpu=i)
    st, margin = nvml_call(nvml, nvml.nvmlDeviceGetMarginTemperature, h)
    if st != "ok":
        c.check("thermal.margin", "skip" if st == "unsupported" else "error", f"thermal margin: {margin}", gpu=i)
    else:
        c.metric("gpu.thermal_margin", margin, "C", gpu=i)
        if margin < opts.thermal_margin_min:
            c.check("thermal.margin", "fail", f"{margin} C to the slowdown limit (floor {opts.thermal_margin_min:g})",
                    "fatal", gpu=i, code="THERMAL")
        else:
            c.check("thermal.margin", "pass", f"{margin} C of margin", gpu=i)
    st, power = nvml_call(nvml, nvml.nvmlDeviceGetPowerUsage, h)
    if st == "ok":
        c.metric("gpu.power", power / 1000.0, "W", gpu=i)
    st, limit = nvml_call(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    if st == "ok":
        c.metric("gpu.power_limit", limit / 1000.0, "W", gpu=i)
        if opts.power_limit_w and limit / 1000.0 < 0.95 * opts.power_limit_w:
            c.check("power.limit", "warn", f"power limit {limit / 1000.0:.0f} W, the profile expects "
                    f"{opts.power_limit_w:.0f} W", "warning", gpu=i)
        elif opts.power_limit_w:
            c.check("power.limit", "pass", f"{limit / 1000.0:.0f} W", gpu=i)


FABRIC_STATES = {1: "not started", 2: "in progress", 3: "completed"}


def _fabric(nvml: Any, h: Any, i: int, c: Collector) -> None:
    """On an NVSwitch system whose GPUs report it (Hopper and later), Fabric Manager registers each
    GPU with the NVLink fabric: until the state is completed with success (Fabric Manager down,
    still starting, or not re-registering a GPU after a reset), CUDA cannot use NVLink there.
    https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/ (nvmlDeviceGetGpuFabricInfo)."""
    fn = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None)
    struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)  # bindings older than R535 have neither
    if fn is None or struct is None:
        return
    info = struct()
    state, value = nvml_call(nvml, fn, h, ctypes.byref(info))
    if state == "unsupported" or (state == "ok" and info.state == 0):  # no NVSwitch fabric to join
        return
    if state == "error":
        c.check("gpu.fabric", "error", f"cannot read the NVLink fabric state: {value}", "warning", gpu=i)
    elif info.state != nvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        c.check("gpu.fabric", "fail", f"not registered with the NVSwitch fabric ({FABRIC_STATES.get(info.state, info.state)}): "
                "Fabric Manager is not running or has not finished", "critical", gpu=i, code="FABRIC_NOT_READY")
    elif info.status != 0:
        c.check("gpu.fabric", "fail", f"NVSwitch fabric registration failed (NVML return {info.status})", "critical",
                gpu=i, code="FABRIC_NOT_READY")
    else:
        c.check("gpu.fabric", "pass", "registered with the NVSwitch fabric", gpu=i)


def _recovery(nvml: Any, h: Any, i: int, c: Collector) -> None:
    st, values = nvml_call(nvml, nvml.nvmlDeviceGetFieldValues, h, [FIELD_RECOVERY_ACTION])
    if st != "ok":
        c.check("gpu.recovery_action", "skip" if st == "unsupported" else "error", f"recovery action: {values}",
                gpu=i)
        return
    v = values[0]
    if v.nvmlReturn != 0:
        c.check("gpu.recovery_action", "skip", "the driver does not report a recovery action", gpu=i)
        return
    action = int(getattr(v.value, _VALUE_ATTR.get(int(v.valueType), "uiVal")))
    status, message, severity, code = recovery_verdict(action)
    c.check("gpu.recovery_action", status, message, severity, gpu=i, code=code)
