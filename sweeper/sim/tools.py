"""What the tools in other images print on a simulated node: `dcgmi diag -j` (DCGM 4.x
layout) and nccl-tests' all_reduce_perf, as the node's fault model implies. The real
parsers read this output, exactly as they read the real tools'."""

from __future__ import annotations

import json
import time
from typing import Any

from sweeper.drivers import branch_of, cuda_of_branch
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


def dcgm_output(spec: NodeSpec, level: int, builds: list[int] | None = None) -> tuple[int, str]:
    """(exit code, stdout) of `dcgmi diag -r LEVEL -j` from an image carrying DCGM's `builds` (CUDA
    majors; None: every build)."""
    hw = HARDWARE[spec.instance_type]
    f = spec.faults
    cuda = cuda_of_branch(branch_of(spec.driver) or 0)
    if builds is not None and cuda not in builds:
        # nvvs loads its plugins from plugins/cuda<the major the driver runs>/, and cannot run without
        # them (NVIDIA/DCGM: nvvs/include/TestFramework.inl, GetPluginCudaDirExtension, LoadPluginWithDir);
        # dcgmi exits with DCGM_ST_NVVS_ERROR (-30, dcgmlib/dcgm_structs.h) as 226.
        words = ("Error: Cannot load plugins. Unable to change to the plugin dir "
                 f"'/usr/libexec/datacenter-gpu-manager-4/plugins/cuda{cuda}/': 'No such file or directory'")
        return 226, json.dumps({"DCGM Diagnostic": {"runtime_error": words, "version": "4.4.2"}}, indent=3)
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
           "metadata": {"Driver Version Detected": spec.driver, "version": "4.2.3"}}
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


# -- the pair pod's program (`pair-allreduce`): path-MTU probes, then a two-node all-reduce ----------------

NCCL_PAIR_SECONDS = 180.0  # a pair's all-reduce sweep from 8 B to 8 GB, once both pods run
RDZV_TIMEOUT = 600.0  # PAIR_RDZV_TIMEOUT's default
# The pod interface's MTU by the node's fabric: the VPC CNI's 9001 on EKS, GKE's gVNIC 8244, 1500 on AKS.
IFACE_MTU = {"efa": 9001, "ena": 9001, "gve": 8244, "ib": 1500}


def ping_probe(iface: str, mtu: int, peer: str, peer_ip: str | None, src_ip: str, local_mtu: int,
               path_mtu: int | None, rtt: float) -> tuple[int, str]:
    """(exit code, output) of iputils `ping -M do -s MTU-28 -c 3 -W 2 -I IFACE PEER`: every reply;
    the kernel refusing a datagram larger than the interface's MTU (`local error: message too
    long`); a path that drops what it cannot carry (no replies, 100% loss); a peer with no DNS name."""
    if peer_ip is None:
        return 2, f"ping: {peer}: Name or service not known\n"
    size = max(0, mtu - 28)
    lines = [f"PING {peer} ({peer_ip}) from {src_ip} {iface}: {size}({size + 28}) bytes of data."]
    if mtu > local_mtu:
        lines += [f"ping: local error: message too long, mtu={local_mtu}"] * 3
        lines += ["", f"--- {peer} ping statistics ---",
                  "3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 2043ms", ""]
        return 1, "\n".join(lines)
    if path_mtu is not None and mtu > path_mtu:
        lines += ["", f"--- {peer} ping statistics ---", "3 packets transmitted, 0 received, 100% packet loss, time 2052ms",
                  ""]
        return 1, "\n".join(lines)
    times = [rtt * f for f in (1.21, 0.98, 1.0)]
    lines += [f"{size + 8} bytes from {peer} ({peer_ip}): icmp_seq={i + 1} ttl=127 time={t:.3f} ms"
              for i, t in enumerate(times)]
    avg = sum(times) / 3
    mdev = (sum((t - avg) ** 2 for t in times) / 3) ** 0.5
    lines += ["", f"--- {peer} ping statistics ---", "3 packets transmitted, 3 received, 0% packet loss, time 2003ms",
              f"rtt min/avg/max/mdev = {min(times):.3f}/{avg:.3f}/{max(times):.3f}/{mdev:.3f} ms", ""]
    return 0, "\n".join(lines)


def mtu_section(iface: str, mtu: int, peer: str, code: int, output: str) -> str:
    """One probe framed by the program's marker lines."""
    return f"# pair-mtu iface={iface} mtu={mtu} peer={peer}\n{output}# pair-mtu-end iface={iface} rc={code}\n"


def parse_bytes(text: str | None, default: int = 8 * 1024 ** 3) -> int:
    """PAIR_MAX_BYTES as nccl-tests reads sizes: a number with an optional K, M or G (powers of 1024)."""
    if not text:
        return default
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else default


def pair_table(hosts: tuple[str, str], model: str, gpus: int, busbw: float, max_bytes: int, rng: Any,
               wrong: bool = False, stop_at: int | None = None) -> tuple[str, int]:
    """Rank 0's all-reduce table as the pair image's allreduce_bench.py prints it, in nccl-tests'
    shape: one process per GPU (nGpus 1), 2 x `gpus` ranks named by their pods' hostnames; the bus
    bandwidth at the largest size is `busbw`, smaller sizes pay a fixed latency. With `wrong`, the
    larger sizes count wrong elements. With `stop_at`, the table ends before that size (the run
    aborted). Returns the text and how many values were wrong."""
    ranks = 2 * gpus
    lines = [f"# nThread 1 nGpus 1 minBytes 8 maxBytes {max_bytes} step: 2(factor) warmup iters: 5 iters: 20 "
             "agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    for r in range(ranks):
        host, g = hosts[r // gpus], r % gpus
        lines.append(f"#  Rank {r:2d} Group  0 Pid {52100 + r:6d} on {host:>10} device {g:2d} "
                     f"[0000:{0x18 + g * 16:02x}:00] {model}")
    lines += ["#", "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place",
              "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw"
              "   busbw  #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)"
              "  (GB/s)"]
    factor = 2 * (ranks - 1) / ranks
    latency = 65.0  # us: a small all-reduce across the fabric
    t_max = max_bytes / (busbw / factor * 1e3) if busbw > 0 else 0.0
    total, n, errors, size = 0.0, 0, 0, 8
    while size <= max_bytes:
        if stop_at is not None and size >= stop_at:
            return "\n".join(lines) + "\n", errors
        cols = []
        for _ in range(2):  # out-of-place, then in-place
            t = (latency + max(0.0, t_max - latency) * size / max_bytes) * rng.uniform(0.995, 1.005)
            algbw = size / (t * 1e3)
            bad = rng.randint(1, max(1, size // 4 // 100_000)) if wrong and size >= 1024 ** 2 else 0
            errors += bad
            cols.append(f"{t:8.2f}  {algbw:6.2f}  {algbw * factor:6.2f}  {bad:6d}")
            total += algbw * factor
            n += 1
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {cols[0]}  {cols[1]}")
        size *= 2
    lines += [f"# Out of bounds values : {errors} {'FAILED' if errors else 'OK'}",
              f"# Avg bus bandwidth    : {total / max(n, 1):g}", "#", ""]
    return "\n".join(lines), errors


def net_error(nic: str, host: str, gpu: int, peer_ip: str) -> str:
    """What a rank prints when its fabric drops under it, in NCCL's own words for its network plugin
    (aws-ofi-nccl's NET/OFI on EFA, NCCL's NET/IB on InfiniBand), then torch's report of it."""
    if nic == "ib":
        warn = (f"{host}:412:977 [{gpu}] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
                f"{peer_ip}<41870> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:{peer_ip}")
        last = "NET/IB : Got completion from peer with status=12 opcode=0 len=0 vendor err 129 (Recv)"
    else:
        warn = (f"{host}:412:977 [{gpu}] nccl_net_ofi_rdma.c:1592 NCCL WARN NET/OFI Request 0x7f2c3c0d91a8 completed "
                "with error. RC: 5. Error: Input/output error. Completed length: 0")
        last = "NET/OFI Request completed with error. RC: 5. Error: Input/output error."
    return (f"{warn}\n"
            f"{host}:412:977 [{gpu}] NCCL INFO transport/net.cc:1302 -> 6\n"
            "[rank0]: torch.distributed.DistBackendError: NCCL error in: "
            "/opt/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote process exited or "
            "there was a network error, NCCL version 2.23.4\n"
            "[rank0]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
            "prematurely.\n"
            f"[rank0]: Last error:\n[rank0]: {last}\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            "============================================================\n"
            "allreduce_bench.py FAILED\n")


def rendezvous_timeout(peer: str, timeout: float, rank: int) -> str:
    """What the pair program prints when its peer's DNS name (published once the peer pod has an
    address) never appears within the rendezvous timeout: torch's RendezvousTimeoutError, by name."""
    return (f"torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: the peer {peer} never came within "
            f"{int(timeout)}s (pair-allreduce, rank {rank})\n")


def nvidia_smi_q(nvml: Any, argv: list[str], now: float) -> tuple[int, str]:
    """(exit code, stdout) of `nvidia-smi -q -d ECC` on the node's fake NVML: its ECC mode and
    counters per GPU, in the layout of a Hopper driver (DRAM and SRAM lines; the parser's fixtures
    nvidia-smi-q-h100-*.txt). Any other display section is refused: the simulator prints only this."""
    words = [w for a in argv[1:] for w in a.replace(",", " ").split()]
    wanted = words[words.index("-d") + 1:] if "-d" in words else words[words.index("--display") + 1:] \
        if "--display" in words else []
    wanted = [w.upper() for w in wanted if not w.startswith("-")]
    if wanted != ["ECC"]:
        return 2, "the simulated nvidia-smi prints only `nvidia-smi -q -d ECC`\n"
    gpus = [g for g in nvml.gpus if not g.lost]
    stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now))
    out = ["", "==============NVSMI LOG==============", "",  # no CUDA Version line: the fleet knows only its major
           f"{'Timestamp':<42}: {stamp}", f"{'Driver Version':<42}: {nvml.driver}", "",
           f"{'Attached GPUs':<42}: {len(gpus)}"]
    for g in gpus:
        out += [f"GPU {g.bus_id}", "    ECC Mode", f"        {'Current':<34}: Enabled",
                f"        {'Pending':<34}: Enabled", "    ECC Errors"]
        for scope, corrected, uncorrected in (("Volatile", g.volatile_corrected, g.volatile_uncorrected),
                                              ("Aggregate", g.aggregate_corrected, g.aggregate_uncorrected)):
            out += [f"        {scope}", f"            {'SRAM Correctable':<30}: 0",
                    f"            {'SRAM Uncorrectable Parity':<30}: 0",
                    f"            {'SRAM Uncorrectable SEC-DED':<30}: 0",
                    f"            {'DRAM Correctable':<30}: {corrected}",
                    f"            {'DRAM Uncorrectable':<30}: {uncorrected}"]
        out += [f"            {'SRAM Threshold Exceeded':<30}: No", "        Aggregate Uncorrectable SRAM Sources"]
        out += [f"            {s:<30}: 0" for s in ("SRAM L2", "SRAM SM", "SRAM Microcontroller", "SRAM PCIE",
                                                    "SRAM Other")]
    return 0, "\n".join(out) + "\n"
