"""A fake NVML with the pynvml API, the exceptions and the ctypes structures of the real bindings,
built from a simulated node's hardware state; and (from `fakehost`) a fake host: sysfs files,
commands, environment. The simulated kubelet hands them to the real checks; the tests build them
directly. tests/test_fake_nvml_real.py holds the fake to what a real H100's NVML answered."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

from sweeper.checks.fakehost import (
    H100_BUS_IDS,
    JOURNALCTL_FORMAT,
    FakeHost,
    bus_id,
    efa_sysfs,
    fi_info_output,
    gpu_pci,
    ib_sysfs,
    journal_file,
    journal_line,
    netdev,
    peermem,
    sxid_line,
    topo_output,
    xid_line,
)

__all__ = [  # the host's fakes moved to fakehost; importable from here as before
    "FakeGpu", "FakeNvml", "H100_BUS_IDS", "bus_id", "xid_line", "sxid_line", "JOURNALCTL_FORMAT",
    "journal_file", "FakeHost", "efa_sysfs", "ib_sysfs", "gpu_pci", "peermem", "journal_line", "netdev",
    "fi_info_output", "topo_output",
]


@dataclass
class FakeGpu:
    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:18:00.0"
    uuid: str = ""
    temperature: int = 35
    memory_mib: int = 81559
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
    retired_pages: int = 0  # pre-Ampere only: read when row remapping is not supported
    retired_pending: bool = False
    nvlinks: int = 18
    nvlink_down: list[int] = field(default_factory=list)
    nvlink_replay: int = 0
    nvlink_recovery: int = 0
    nvlink_crc: int = 0
    pcie_gen: int = 1  # a link at idle runs at a low generation
    pcie_max_gen: int = 5
    pcie_width: int = 16
    pcie_max_width: int = 16
    pcie_replays: int = 0
    clock_reasons: int = 0x1  # GpuIdle
    margin: int = 40  # degrees C to the slowdown limit
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    recovery_action: int | None = 0  # None: the driver does not report it
    pci_device_id: int = 0x233010DE  # H100 SXM5 80GB (device 0x2330, vendor 0x10de)
    pci_subsystem_id: int = 0x16C110DE
    lost: bool = False
    # NVSwitch fabric registration (3: completed); 0: Hopper or later with no fabric to join (NVML answers
    # with state 0, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED); None: a GPU whose NVML does not report it at all
    fabric_state: int | None = None
    fabric_status: int = 0  # an NVML return code: 0 is success
    vbios: str = "96.00.DA.00.0C"  # an H100 80GB HBM3's, as NVML read it on one (driver 580.159.04)
    serial: str = ""  # "": one made from the index
    board_part_number: str = "692-2G520-0200-000"


@dataclass
class FakeNvml:
    """Answers the pynvml calls the checks make, from a list of FakeGpu."""

    gpus: list[FakeGpu] = field(default_factory=list)
    driver: str = "570.133.20"
    library_present: bool = True
    cuda: int | None = 12080  # nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor; None: not supported

    def __getattr__(self, name: str) -> Any:
        # The constants and exception classes are the real bindings' own; functions are not,
        # so a check calling something this fake lacks fails loudly instead of touching a GPU.
        if name.startswith("NVML"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def nvmlInit(self) -> None:
        if not self.library_present:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        return f"{(self.cuda or 0) // 1000}.{self.driver}"  # "13.580.159.04" on driver 580

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        if self.cuda is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def _alive(self, h: FakeGpu) -> FakeGpu:
        if h.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return h

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._alive(h).name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid or f"GPU-{h.index:08x}-0000-0000-0000-000000000000"

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        """The bindings' own nvmlPciInfo_t, its strings as bytes as the real library fills them."""
        domain, bus, rest = h.bus_id.split(":")
        device = rest.split(".")[0]
        return pynvml.nvmlPciInfo_t(busIdLegacy=f"{domain[-4:]}:{bus}:{rest}".encode(), domain=int(domain, 16),
                                    bus=int(bus, 16), device=int(device, 16), pciDeviceId=h.pci_device_id,
                                    pciSubSystemId=h.pci_subsystem_id, busId=h.bus_id.encode())

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return h.temperature

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        total = self._alive(h).memory_mib * 2**20
        used = 480 * 2**20  # what the driver reserves on an idle H100 (an idle 80GB HBM3 reads 480 MiB used)
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPersistenceMode(self, h: FakeGpu) -> int:
        return 1 if h.persistence else 0

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter_type: int) -> int:
        if not self._alive(h).ecc_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter_type == pynvml.NVML_VOLATILE_ECC:
            return h.volatile_corrected if corrected else h.volatile_uncorrected
        return h.aggregate_corrected if corrected else h.aggregate_uncorrected

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        if not h.remap_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (h.remapped_corrected, h.remapped_uncorrected, int(h.remap_pending), int(h.remap_failure))

    def nvmlDeviceGetRetiredPages(self, h: FakeGpu, cause: int) -> list[int]:
        if h.remap_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        half = h.retired_pages // 2
        return list(range(half if cause == 0 else h.retired_pages - half))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        if h.remap_supported:  # a GPU that remaps rows does not report page retirement at all (a real H100)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(h.retired_pending)

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        if h.nvlinks == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < h.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_DISABLED if link in h.nvlink_down else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h: FakeGpu, link: int, counter: int) -> int:
        if link != 0:
            return 0
        return {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: h.nvlink_replay,
                pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: h.nvlink_recovery,
                pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: h.nvlink_crc}.get(counter, 0)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeGpu) -> int:
        return self._alive(h).pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeGpu) -> int:
        return h.pcie_max_width

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeGpu) -> int:
        return h.pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeGpu) -> int:
        return h.pcie_max_gen

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeGpu) -> int:
        return h.pcie_replays

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return h.clock_reasons

    def nvmlDeviceGetMarginTemperature(self, h: FakeGpu) -> int:
        return h.margin

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return h.power_limit_mw

    def nvmlDeviceGetGpuFabricInfo(self, h: FakeGpu, ref: Any) -> int:
        """Fills the caller's c_nvmlGpuFabricInfo_t, passed by reference as to the real library."""
        if h.fabric_state is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        # A Hopper GPU with no NVSwitch answers success with state 0 (NOT_SUPPORTED) and the rest zero.
        info = ref._obj
        info.state, info.status = h.fabric_state, h.fabric_status
        return 0

    def nvmlDeviceGetVbiosVersion(self, h: FakeGpu) -> str:
        return self._alive(h).vbios

    def nvmlDeviceGetSerial(self, h: FakeGpu) -> str:
        return h.serial or f"{1652924077000 + h.index}"

    def nvmlDeviceGetBoardPartNumber(self, h: FakeGpu) -> str:
        return h.board_part_number

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, field_ids: list[int]) -> Any:
        """The bindings' own array of c_nvmlFieldValue_t, each value in the c_nvmlValue_t union; the
        timestamp is 0 (a fake has no clock of its own; the checks do not read it)."""
        out = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, fid in zip(out, field_ids, strict=True):
            known = fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and h.recovery_action is not None
            slot.fieldId, slot.scopeId, slot.timestamp, slot.latencyUsec = fid, 0, 0, 8
            slot.nvmlReturn = 0 if known else pynvml.NVML_ERROR_NOT_SUPPORTED
            slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            slot.value.uiVal = h.recovery_action or 0
        return out
