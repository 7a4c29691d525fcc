"""What the tools in other images print on a simulated node: `dcgmi diag -j` (DCGM 4.x
layout) and nccl-tests' all_reduce_perf, as the node's fault model implies. The real
parsers read this output, exactly as they read the real tools'."""

from __future__ import annotations

import json
from typing import Any

from sweeper.sim.fleet import HARDWARE, NodeSpec

DCGM_SECONDS = {1: 45.0, 2: 150.0, 3: 900.0, 4: 5400.0}
NCCL_SECONDS = 120.0
LEVEL_TESTS = {
    1: [("Deployment", "software")],
    2: [("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory")],
    3: [("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory"), ("Hardware", "diagnostic"),
        ("Hardware", "nvbandwidth"), ("Stress", "memory_bandwidth"), ("Stress", "targeted_stress"),
        ("Stress", "targeted_power")],
}
LEVEL_TESTS[4] = LEVEL_TESTS[3] + [("Stress", "memtest"), ("Hardware", "pulse_test")]


def dcgm_level(argv: list[str]) -> int:
    aliases = {"quick": 1, "short": 1, "medium": 2, "long": 3, "xlong": 4}
    for i, a in enumerate(argv):
        if a in ("-r", "--run") and i + 1 < len(argv):
            v = argv[i + 1]
            return int(v) if v.isdigit() else aliases.get(v, 1)
    return 1


def _warning(error_id: int, severity: int, category: int, text: str) -> dict[str, Any]:
    return {"error_category": category, "error_id": error_id, "error_severity": severity, "warning": text}


def dcgm_output(spec: NodeSpec, level: int) -> tuple[int, str]:
    """(exit code, stdout) of `dcgmi diag -r LEVEL -j`."""
    hw = HARDWARE[spec.instance_type]
    f = spec.faults
    if f.dcgm_runtime_error:
        failed_doc = {"DCGM Diagnostic": {"runtime_error": "Error: Unable to complete diagnostic for group 2147483647. "
                                                    "Return: (-39) The diagnostic is already running",
                                   "version": "4.2.3"}}
        return 217, json.dumps(failed_doc, indent=3, sort_keys=True)
    gpus = list(range(max(0, hw["gpus"] - f.missing_gpus)))
    problems: dict[tuple[str, int], dict[str, Any]] = {}
    for g in f.ecc_dbe:
        problems[("memory", g)] = _warning(4, 2, 10, f"Detected {f.ecc_dbe[g]} volatile double-bit ECC error(s) in GPU {g}.")
    for g in f.remap_pending:
        problems[("software", g)] = _warning(85, 6, 10, f"GPU {g} has pending row remaps; a GPU reset is required.")
    for g in f.remap_failure:
        problems[("software", g)] = _warning(80, 6, 10, f"GPU {g} had uncorrectable memory errors and row remapping failed.")
    for g in f.pcie_replay:
        problems[("pcie", g)] = _warning(3, 2, 13, f"Detected more than 8 PCIe replays per minute for GPU {g} : 57")
    for g in f.nvlink_down:
        problems[("pcie", g)] = _warning(14, 4, 11, f"GPU {g}'s NvLink link 3 is currently down")
    for g in f.pcie_downtrained:
        problems[("pcie", g)] = _warning(46, 4, 13, f"GPU {g} is running at PCI link width 8X, which is below the "
                                         "minimum allowed link width of 16 (parameter 'min_pci_width')")
    for g, test in f.dcgm_fail.items():
        problems[(test, g)] = _warning(52, 2, 10, f"Found 3 faulty memory elements on GPU {g}") if "mem" in test \
            else _warning(50, 4, 1, f"Max stress level of 11250 did not reach desired stress level of 29250 for GPU {g}")
    categories: dict[str, list[dict[str, Any]]] = {}
    worst = 0
    for category, test in LEVEL_TESTS[min(max(level, 1), 4)]:
        results = []
        summary: dict[str, Any] = {"status": "Pass"}
        for g in gpus:
            entry: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": g, "status": "Pass"}
            w = problems.get((test, g))
            if w:
                entry["status"] = "Fail"
                entry["warnings"] = [w]
                summary = {"status": "Fail", "warnings": summary.get("warnings", []) + [w]}
                worst = max(worst, 2 if w["error_severity"] in (2, 6) else 1)
            elif test == "pcie":
                entry["info"] = [f"GPU {g} GPU to Host bandwidth:\t\t{53.0 + g * 0.1:.2f} GB/s"]
            results.append(entry)
        categories.setdefault(category, []).append({"name": test, "results": results, "test_summary": summary})
    doc: dict[str, Any] = {"DCGM Diagnostic": {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]},
           "entity_groups": [{"entities": [{"device_id": hw["device_id"], "entity_id": g,
                                            "serial_num": f"16549220{abs(hash(spec.name)) % 10**5:05d}{g}"} for g in gpus],
                              "entity_group": "GPU", "entity_group_id": 1}],
           "metadata": {"Driver Version Detected": "570.133.20", "version": "4.2.3"}}
    exit_code = {0: 0, 1: 226, 2: 205}[worst]
    return exit_code, json.dumps(doc, indent=3, sort_keys=True)


def nccl_output(spec: NodeSpec, node_name: str) -> tuple[int, str]:
    """(exit code, stdout) of `all_reduce_perf -b 8 -e 8G -f 2 -g N` on one node."""
    hw = HARDWARE[spec.instance_type]
    gpus = max(0, hw["gpus"] - spec.faults.missing_gpus)
    peak = hw["nccl_peak"] * spec.faults.low_bandwidth
    lines = ["# nccl-tests version 2.19.6 nccl-headers=22705 nccl-library=22705",
             "# Collective test starting: all_reduce_perf",
             f"# nThread 1 nGpus {gpus} minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 1 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0 unalign: 0", "#", "# Using devices"]
    for g in range(gpus):
        lines.append(f"#  Rank {g:2d} Group  0 Pid  41723 on {node_name:>14} device {g:2d} [0000:{0x18 + g * 16:02x}:00] "
                     f"{hw['model']}")
    lines += ["#", "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
              "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw"
              "   busbw  #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)"
              "  (GB/s)"]
    factor = 2 * (gpus - 1) / gpus if gpus > 1 else 1.0
    total = 0.0
    n = 0
    size = 8
    while size <= 8 * 1024 ** 3:
        busbw = peak * size / (size + 64 * 1024 ** 2)
        algbw = busbw / factor
        t = size / (algbw * 1e3) if algbw > 0 else 0.0
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {t:7.2f}  {algbw:6.2f}  {busbw:6.2f}"
                     f"       0  {t:7.2f}  {algbw:6.2f}  {busbw:6.2f}       0")
        total += 2 * busbw
        n += 2
        size *= 2
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {total / n:.3f}", "#",
              "# Collective test concluded: all_reduce_perf", ""]
    return 0, "\n".join(lines)
