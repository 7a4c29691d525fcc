"""The evidence bundle: how long `sweeper evidence`'s collector takes and how big its bundle and
the pod log that carries it are, for an 8-GPU node's outputs and for a kernel log that floods.

    python -m benchmarks.evidence [--kernel-mib 64] [--cap-mib 2] [--json]

Cases: `typical` (a few MiB of kernel log, eight GPUs' nvidia-smi -q, the fabric manager's log),
and `flood` (--kernel-mib of kernel log that gzip cannot shrink, as a node spewing hex dumps
writes: the part is cut, then halved, until the bundle fits the cap). Printed per case: seconds,
the bundle's bytes, the pod log's bytes (base64 with its markers), and what the manifest says of
each part. The log must stay under the kubelet's containerLogMaxSize (10 MiB by default)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import time
from typing import Any

from sweeper.checks.evidence import collect, emit, extract, read_manifest
from sweeper.checks.fake import FakeHost

MiB = 1024 * 1024
CONTAINER_LOG_MAX = 10 * MiB


def _xid_log(mib: float) -> str:
    line = "[{t:>12.6f}] NVRM: Xid (PCI:0000:{b:02x}:00): 79, pid=1234, GPU has fallen off the bus.\n"
    out, size, i = [], 0, 0
    while size < mib * MiB:
        s = line.format(t=i * 0.01, b=0x18 + (i % 8) * 0x10)
        out.append(s)
        size += len(s)
        i += 1
    return "".join(out)


def _noise(mib: float) -> str:
    raw = base64.b64encode(os.urandom(int(mib * MiB * 3 / 4))).decode()
    return "\n".join(raw[i:i + 120] for i in range(0, len(raw), 120)) + "\n"


def _smi_q(gpus: int) -> str:
    block = "".join(f"    {'Field ' + str(k):<50}: value {k}\n" for k in range(300))
    return "==============NVSMI LOG==============\n" + "".join(f"GPU 00000000:{0x18 + g * 0x10:02X}:00.0\n{block}"
                                                              for g in range(gpus))


def case(name: str, kernel: str, cap: int) -> dict[str, Any]:
    host = FakeHost(commands={"dmesg": (0, kernel, ""), "nvidia-smi": (0, _smi_q(8), "")},
                    files={"/var/log/fabricmanager.log": "[INFO] Fabric Manager running\n" * 20000})
    t0 = time.perf_counter()
    got = collect(host, "gpu-bench", cap, now=0.0)
    log = emit(got.bundle)
    seconds = time.perf_counter() - t0
    assert extract(log, cap) == got.bundle and read_manifest(got.bundle)["node"] == "gpu-bench"
    return {"case": name, "seconds": round(seconds, 3), "bundle_bytes": len(got.bundle), "log_bytes": len(log),
            "under_container_log_max": len(log) < CONTAINER_LOG_MAX,
            "parts": {p["file"]: f"{p['status']} {p['bytes']}/{p['original_bytes']}" for p in got.manifest["parts"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel-mib", type=float, default=64.0)
    ap.add_argument("--cap-mib", type=float, default=2.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cap = int(a.cap_mib * MiB)
    rows = [case("typical", _xid_log(3), cap), case("flood", _noise(a.kernel_mib), cap)]
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['case']:<8} {r['seconds']:>7.3f} s  bundle {r['bundle_bytes']:>9,} B  pod log {r['log_bytes']:>9,} B"
              f"  (under containerLogMaxSize: {r['under_container_log_max']})")
        for f, s in r["parts"].items():
            print(f"           {f:<26} {s}")


if __name__ == "__main__":
    main()
