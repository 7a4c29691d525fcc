"""What reading other tools' claims adds to a discovery pass, as the fleet grows.

    python -m benchmarks.claims [--nodes 1000 5000]

Each node object carries the kubelet's conditions and the EKS node monitoring agent's; every
other node an AcceleratedHardwareReady=False claim, every tenth an NVSentinel condition and a
DRA device taint. Timed: the claims read off every node against the shipped catalogue, and the
history's one query for the claims already settled, with one judgment
recorded per claimed node before.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from sweeper.claims import claims_on, load_catalog
from sweeper.history import History
from sweeper.kube.dra import DEVICES

T0 = 1_800_000_000.0


def node(i: int) -> dict[str, Any]:
    conds = [{"type": t, "status": "False", "reason": f"Kubelet{t}"} for t in ("MemoryPressure", "DiskPressure")]
    conds += [{"type": "Ready", "status": "True"},
              {"type": "AcceleratedHardwareReady", "status": "False" if i % 2 else "True",
               "reason": "NvidiaXID79Error" if i % 2 else "AcceleratedHardwareIsReady",
               "lastTransitionTime": "2027-01-15T08:00:00Z"}]
    obj: dict[str, Any] = {"metadata": {"name": f"gpu-{i:05d}"}, "spec": {}, "status": {"conditions": conds}}
    if i % 10 == 0:
        conds.append({"type": "GpuMemWatch", "status": "True", "reason": "GpuMemWatchIsNotHealthy"})
        obj[DEVICES] = {"gpu.nvidia.com": {"pool": obj["metadata"]["name"], "devices": ["gpu-0"], "taints": [
            {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule", "device": "gpu-0"}]}}
    return obj


def measure(n: int) -> dict[str, float]:
    cat = load_catalog()
    nodes = [node(i) for i in range(n)]
    t = time.perf_counter()
    found = {o["metadata"]["name"]: claims_on(o, cat) for o in nodes}
    read = time.perf_counter() - t
    claimed = sorted(k for k, v in found.items() if v)
    with tempfile.TemporaryDirectory() as tmp:
        h = History(Path(tmp) / "h.db")
        for name in claimed:
            c = found[name][0]
            h.claim_result("r", None, name, T0, {"source": c.source, "code": c.code, "kind": c.kind,
                                                 "test": c.test, "since": c.since}, "refuted", "")
        t = time.perf_counter()
        settled = h.claims_settled(claimed)
        query = time.perf_counter() - t
        h.close()
    return {"nodes": n, "claims": sum(len(v) for v in found.values()), "claimed_nodes": len(claimed),
            "read_ms": read * 1000, "settled_ms": query * 1000, "settled": len(settled)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    args = ap.parse_args()
    for n in args.nodes:
        m = measure(n)
        print(f"{m['nodes']:>6} nodes: {m['claims']:>5} claims on {m['claimed_nodes']:>5} nodes read in "
              f"{m['read_ms']:.0f} ms ({m['read_ms'] * 1000 / n:.0f} us a node); settled ones looked up in "
              f"{m['settled_ms']:.0f} ms ({m['settled']} found)")


if __name__ == "__main__":
    main()
