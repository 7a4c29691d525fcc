"""A fake node's host, built from a simulated node's hardware state: its files (sysfs, journal
files), the commands of the check image, its environment, and the raw output of the tools the
simulated kubelet runs (`nvidia-smi topo -m`, `fi_info`, kernel log lines). The fake NVML is in
`sweeper.checks.fake`, which re-exports these names."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sweeper.checks.host import JOURNAL_DIRS

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


def fi_info_output(devices: list[str]) -> str:
    """`fi_info -p efa -t FI_EP_RDM` for these devices, libfabric 1.x layout."""
    if not devices:
        return "fi_getinfo: -61 (No data available)\n"
    blocks = [f"provider: efa\n    fabric: efa\n    domain: {d}-rdm\n    version: 120.0\n"
              f"    type: FI_EP_RDM\n    protocol: FI_PROTO_EFA\n" for d in devices]
    return "".join(blocks)


def topo_output(gpus: int, nvlinks: int, nics: int, nic_path: str = "PXB", far: bool = False) -> str:
    """`nvidia-smi topo -m` for `gpus` GPUs joined by `nvlinks` NVLinks each and `nics` NICs
    spread over the PCIe switches; `far` puts every NIC across the CPU socket (SYS)."""
    cols = [f"GPU{i}" for i in range(gpus)] + [f"NIC{k}" for k in range(nics)]
    head = "\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    per_switch = max(1, gpus // max(1, nics)) if nics else 1

    def gpu_nic(g: int, k: int) -> str:
        if far:
            return "SYS"
        if g // per_switch == k:
            return nic_path
        return "NODE" if (g < gpus // 2) == (k < nics // 2) else "SYS"

    lines = [head]
    for g in range(gpus):
        cells = [" X " if g == h else (f"NV{nvlinks}" if nvlinks else "SYS") for h in range(gpus)]
        cells += [gpu_nic(g, k) for k in range(nics)]
        cpus = "0-47,96-143" if g < gpus // 2 else "48-95,144-191"
        lines.append(f"GPU{g}\t" + "\t".join(cells) + f"\t{cpus}\t{0 if g < gpus // 2 else 1}\t\tN/A")
    for k in range(nics):
        cells = [gpu_nic(g, k) for g in range(gpus)]
        cells += [" X " if k == j else "SYS" for j in range(nics)]
        lines.append(f"NIC{k}\t" + "\t".join(cells))
    legend = ["", "Legend:", "", "  X    = Self", "  SYS  = Connection traversing PCIe as well as the SMP "
              "interconnect between NUMA nodes (e.g., QPI/UPI)", "  PXB  = Connection traversing multiple PCIe "
              "bridges (without traversing the PCIe Host Bridge)", "  NV#  = Connection traversing a bonded set "
              "of # NVLinks", "", "NIC Legend:", ""]
    legend += [f"  NIC{k}: mlx5_{k}" for k in range(nics)]
    return "\n".join(lines + legend) + "\n"
