"""What the simulated kubelet runs for `sweeper evidence`: the real collector
(sweeper.checks.evidence) against the node's fake host, whose image programs answer from the
node's fault model: `dmesg` its kernel log, `nvidia-smi -q` its NVML (the ECC section the
simulator prints), `nvidia-smi nvlink -s` its links. The check image has no nvidia-bug-report.sh
(it ships with the driver, not with NVIDIA's container toolkit), so the bundle says it is missing."""

from __future__ import annotations

import gzip
import tarfile
from dataclasses import dataclass
from typing import Any

from sweeper.checks.fake import FakeHost, FakeNvml
from sweeper.sim import tools


@dataclass
class EvidenceHost:
    """A FakeHost whose nvidia-smi and dmesg answer as the node would."""

    host: FakeHost
    nvml: FakeNvml | None  # None: the pod sees no GPU (no NVIDIA runtime put nvidia-smi there)
    kernel_log: str
    now: float

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        prog = argv[0]
        if prog == "dmesg":
            return 0, self.kernel_log, ""
        if prog == "nvidia-smi":
            if self.nvml is None:
                raise FileNotFoundError(prog)
            if argv[1:3] == ["nvlink", "-s"]:
                return 0, nvlink_status(self.nvml), ""
            if argv[1:] == ["-q"]:
                code, out = tools.nvidia_smi_q(self.nvml, ["nvidia-smi", "-q", "-d", "ECC"], self.now)
                return code, out, ""
        if prog in ("nvidia-bug-report.sh", "nvidia-smi"):
            raise FileNotFoundError(prog)
        return self.host.run(argv, timeout, env)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.host, name)


def nvlink_status(nvml: FakeNvml) -> str:
    """`nvidia-smi nvlink -s` as a Hopper driver prints it: each GPU, then each link's speed, or
    `<inactive>` for a link that is down."""
    out = []
    for g in nvml.gpus:
        if g.lost:
            continue
        out.append(f"GPU {g.index}: {g.name} (UUID: GPU-{g.index:08x}-sim)")
        out += [f"\t Link {k}: " + ("<inactive>" if k in g.nvlink_down else "26.562 GB/s") for k in range(g.nvlinks)]
    return "\n".join(out) + "\n"


def fabric_manager_log(down: bool) -> str:
    """/var/log/fabricmanager.log of an NVSwitch node: started, or failed to start."""
    if down:
        return ("[Nov 20 2026 10:00:01] [INFO] [tid 1201] Fabric Manager version 570.124.06 is running\n"
                "[Nov 20 2026 10:00:03] [ERROR] [tid 1201] request to query NVSwitch device information from "
                "NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]\n"
                "[Nov 20 2026 10:00:03] [ERROR] [tid 1201] Failed to initialize fabric manager: Fabric Manager "
                "will not start\n")
    return ("[Nov 20 2026 10:00:01] [INFO] [tid 1201] Fabric Manager version 570.124.06 is running\n"
            "[Nov 20 2026 10:00:04] [INFO] [tid 1201] Successfully configured all the available NVSwitches\n")


# A hostile node's bundle: a tar.gz whose first header is an extension (a GNU long name, a PAX
# header) claiming a terabyte of zeros. A reader that follows it asks for the whole terabyte at once.
FORGERIES = {"longname-bomb": tarfile.GNUTYPE_LONGNAME, "pax-bomb": tarfile.XHDTYPE}


def forged(kind: str) -> bytes:
    """The forgery `kind` (FORGERIES), a few kilobytes compressed."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = FORGERIES[kind], 1 << 40
    return gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT) + bytes(1 << 20), mtime=0)
