"""A fake NVML with the pynvml API and the exceptions of the real bindings, and a fake host
(sysfs files, commands, environment), both built from a simulated node's hardware state.
The simulated kubelet hands them to the real checks; the tests build them directly."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from sweeper.checks.fake_tools import fi_info_output, topo_output  # noqa: F401 - imported from here too
from sweeper.checks.host import JOURNAL_DIRS


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
    lost: bool = False
    fabric_state: int | None = None  # NVSwitch fabric registration (3: completed); None: no fabric to join
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

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        if self.cuda is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.cuda

    def nvmlDeviceGetVbiosVersion(self, h: FakeGpu) -> str:
        return self._alive(h).vbios

    def nvmlDeviceGetSerial(self, h: FakeGpu) -> str:
        return self._alive(h).serial or f"16529240{h.index:05d}"

    def nvmlDeviceGetBoardPartNumber(self, h: FakeGpu) -> str:
        return self._alive(h).board_part_number

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
        return SimpleNamespace(busId=h.bus_id)

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return h.temperature

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        total = self._alive(h).memory_mib * 2**20
        return SimpleNamespace(total=total, free=total - 328 * 2**20, used=0)

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
        info = ref._obj
        info.state, info.status = h.fabric_state, h.fabric_status
        return 0

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, field_ids: list[int]) -> list[Any]:
        out = []
        for fid in field_ids:
            known = fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and h.recovery_action is not None
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=0 if known else pynvml.NVML_ERROR_NOT_SUPPORTED,
                                       valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                                       value=SimpleNamespace(uiVal=h.recovery_action or 0)))
        return out


H100_BUS_IDS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def bus_id(index: int) -> str:
    bus = H100_BUS_IDS[index] if index < len(H100_BUS_IDS) else f"{0x10 + index:02x}"
    return f"00000000:{bus.upper()}:00.0"


def xid_line(uptime: float, index: int, code: int, text: str) -> str:
    bus = bus_id(index).split(":")[1].lower()
    return f"[{uptime:12.6f}] NVRM: Xid (PCI:0000:{bus}:00): {code}, pid='<unknown>', name=<unknown>, {text}"


def sxid_line(uptime: float, switch: int, code: int, fatal: bool) -> str:
    """An NVSwitch error as the nvswitch driver logs it; the switches sit on their own buses."""
    return (f"[{uptime:12.6f}] nvidia-nvswitch{switch}: SXid (PCI:0000:{0x05 + switch:02x}:00.0): {code}, "
            f"{'Fatal' if fatal else 'Non-fatal'}, Link {10 + switch} simulated switch error")


# The newest format of `journal_file` the check image's journalctl reads; a host's journald that
# writes a newer one makes it skip the file with a warning, as systemd's journalctl does.
JOURNALCTL_FORMAT = 1


def journal_file(boot_id: str, node: str, kernel_lines: list[str], fmt: int = JOURNALCTL_FORMAT) -> str:
    """A stand-in for a journal file: its boot ID, its format, and its kernel lines as
    `journalctl -k -o short-monotonic` prints them."""
    return f"#journal boot={boot_id} format={fmt}\n" + "".join(journal_line(node, ln) + "\n" for ln in kernel_lines)


@dataclass
class FakeHost:
    """A node's files and commands from a table: `files` maps absolute paths to contents (the
    directories follow from them) and `commands` maps a program of the check image to (exit code,
    stdout, stderr); a program not in its table is not installed. The image's journalctl, where
    `commands` has it, reads the `journal_file`s under its `--root` as the real one reads journal files."""

    files: dict[str, str] = field(default_factory=dict)
    commands: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    ran: list[list[str]] = field(default_factory=list)  # every command line asked for, in order
    environ: dict[str, str] = field(default_factory=dict)
    arch: str = "x86_64"
    boot: str = ""  # the kernel's boot ID; "" when it cannot be read

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def listdir(self, path: str) -> list[str] | None:
        prefix = path.rstrip("/") + "/"
        names = {p[len(prefix):].split("/")[0] for p in self.files if p.startswith(prefix)}
        return sorted(names) if names else None

    def exists(self, path: str) -> bool:
        return path in self.files or self.listdir(path) is not None

    def resolve(self, path: str) -> str:
        return path

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        self.ran.append(list(argv))
        if argv[0] not in self.commands:
            raise FileNotFoundError(argv[0])
        if argv[0] == "journalctl":
            return self._journalctl(argv)
        return self.commands[argv[0]]

    def _journalctl(self, argv: list[str]) -> tuple[int, str, str]:
        """This boot's (`-b ID`) lines of the journal files under `--root`; a file of a newer format is
        skipped with journalctl's warning, and a boot no readable file holds exits 1."""
        root = next((a.split("=", 1)[1] for a in argv if a.startswith("--root=")), "/").rstrip("/")
        boot = argv[argv.index("-b") + 1] if "-b" in argv else self.boot
        found, out, err = False, [], []
        for path in sorted(p for p in self.files if p.endswith(".journal")
                           and any(p.startswith(f"{root}{d}/") for d in JOURNAL_DIRS)):
            head, _, body = self.files[path].partition("\n")
            m = re.fullmatch(r"#journal boot=(\w+) format=(\d+)", head)
            if not m or int(m[2]) > JOURNALCTL_FORMAT:
                err.append(f"Journal file {path} uses an unsupported feature, ignoring file.\n"
                           f"Use SYSTEMD_LOG_LEVEL=debug journalctl --file={path} to see the details.\n")
            elif m[1] == boot:
                found = True
                out.append(body)
        if not found:
            # systemd 252's words and exit status for a boot no readable file holds
            err.append(f"Data from the specified boot ({boot}) is not available: No such boot ID in journal\n")
            return 1, "", "".join(err)
        return 0, "".join(out), "".join(err)

    def boot_id(self) -> str | None:
        return self.boot or None

    def env(self) -> dict[str, str]:
        return dict(self.environ)

    def machine(self) -> str:
        return self.arch


def efa_sysfs(count: int, *, down: tuple[int, ...] = (), rate: int = 100, gpudirect: bool = True,
              counters: dict[str, int] | None = None) -> dict[str, str]:
    """/sys/class/infiniband for `count` EFA devices, as the EFA driver lays it out."""
    files: dict[str, str] = {}
    for i in range(count):
        dev = f"rdmap{16 + i * 16 if count <= 8 else 16 + i}s{27 if i % 2 == 0 else 0}"
        base = f"/sys/class/infiniband/{dev}"
        files[f"{base}/device/vendor"] = "0x1d0f\n"
        files[f"{base}/device/p2p"] = "NVIDIA\n" if gpudirect else "\n"
        files[f"{base}/device/numa_node"] = f"{0 if i < count / 2 else 1}\n"
        files[f"{base}/device/infiniband_verbs/uverbs{i}/ibdev"] = f"{dev}\n"
        files[f"{base}/ports/1/state"] = "1: DOWN\n" if i in down else "4: ACTIVE\n"
        files[f"{base}/ports/1/phys_state"] = "5: LinkUp\n"
        files[f"{base}/ports/1/rate"] = f"{rate} Gb/sec (4X EDR)\n"
        files[f"{base}/ports/1/link_layer"] = "Unspecified\n"
        for name in ("rx_drops", "rdma_read_wr_err", "rdma_write_wr_err", "retrans_timeout_events",
                     "unresponsive_remote_events", "impaired_remote_conn_events", "tx_bytes", "rx_bytes"):
            files[f"{base}/ports/1/hw_counters/{name}"] = f"{(counters or {}).get(name, 0)}\n"
    return files


def ib_sysfs(count: int, *, down: tuple[int, ...] = (), rate: int = 400) -> dict[str, str]:
    """/sys/class/infiniband for `count` ConnectX HCAs (mlx5_N)."""
    files: dict[str, str] = {}
    for i in range(count):
        base = f"/sys/class/infiniband/mlx5_{i}"
        files[f"{base}/device/vendor"] = "0x15b3\n"
        files[f"{base}/device/numa_node"] = f"{0 if i < count / 2 else 1}\n"
        files[f"{base}/device/infiniband_verbs/uverbs{i}/ibdev"] = f"mlx5_{i}\n"
        files[f"{base}/ports/1/state"] = "1: DOWN\n" if i in down else "4: ACTIVE\n"
        files[f"{base}/ports/1/rate"] = f"{rate} Gb/sec (4X NDR)\n"
        files[f"{base}/ports/1/link_layer"] = "InfiniBand\n"
        for name in ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors"):
            files[f"{base}/ports/1/counters/{name}"] = "0\n"
    return files


def gpu_pci(count: int) -> dict[str, str]:
    """/sys/bus/pci/devices for `count` NVIDIA GPUs (3D controllers), half on each NUMA node."""
    files: dict[str, str] = {}
    for i in range(count):
        base = f"/sys/bus/pci/devices/{bus_id(i)[4:].lower()}"
        files.update({f"{base}/vendor": "0x10de\n", f"{base}/class": "0x030200\n",
                      f"{base}/numa_node": f"{0 if i < count / 2 else 1}\n"})
    return files


def peermem(module: str = "efa_nv_peermem") -> dict[str, str]:
    """A loaded GPUDirect RDMA peer-memory module, as /sys/module shows it."""
    return {f"/sys/module/{module}/initstate": "live\n"}


def journal_line(node: str, kernel_line: str) -> str:
    """A `dmesg` line as `journalctl -k -o short-monotonic` prints it: the same stamp (seconds since
    boot), then the host and `kernel:` before the message."""
    stamp, _, message = kernel_line.partition("] ")
    return f"{stamp}] {node} kernel: {message}"


def netdev(name: str, driver: str, mtu: int, up: bool = True) -> dict[str, str]:
    base = f"/sys/class/net/{name}"
    return {f"{base}/mtu": f"{mtu}\n", f"{base}/operstate": "up\n" if up else "down\n",
            f"{base}/device/uevent": f"DRIVER={driver}\nPCI_SLOT_NAME=0000:00:05.0\n"}

