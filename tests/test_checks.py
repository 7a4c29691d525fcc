"""The node-local checks against the fake NVML (the same backend the simulated kubelet uses)."""

from sweeper.checks import run_node_checks
from sweeper.checks.fake import (
    JOURNALCTL_FORMAT,
    FakeGpu,
    FakeHost,
    FakeNvml,
    bus_id,
    efa_sysfs,
    fi_info_output,
    gpu_pci,
    ib_sysfs,
    journal_file,
    journal_line,
    netdev,
    peermem,
    topo_output,
    xid_line,
)
from sweeper.checks.options import CheckOptions
from sweeper.result import TOOL_CHECK

NOW = 1_790_000_000.0
OPTS = CheckOptions(node="n1", expect_gpus=8, gpu_model="H100")
# A kernel log with no GPU trouble: an empty one is not a kernel log and reads as an error.
CLEAN_LOG = "[    5.000000] nvidia: loading out-of-tree module taints kernel.\n"


def gpus(n: int = 8, **faults: object) -> list[FakeGpu]:
    return [FakeGpu(index=i, bus_id=bus_id(i), **faults) for i in range(n)]  # type: ignore[arg-type]


def by_name(result, name):
    return [c for c in result.checks if c.name == name]


def test_a_healthy_node_passes_every_check() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus()), CLEAN_LOG, now=NOW, uptime=100)
    assert r.status == "pass"
    assert {c.name for c in r.checks} >= {"gpu.count", "gpu.model", "ecc.volatile_uncorrected", "row_remap", "xid"}
    assert len(by_name(r, "row_remap")) == 8


def test_a_missing_gpu_fails_the_count() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus(7)), CLEAN_LOG, now=NOW)
    assert by_name(r, "gpu.count")[0].status == "fail" and "7 GPUs visible" in by_name(r, "gpu.count")[0].message


def test_wrong_model_fails() -> None:
    r = run_node_checks(OPTS, FakeNvml([FakeGpu(i, name="NVIDIA A100-SXM4-40GB", bus_id=bus_id(i)) for i in range(8)]),
                        CLEAN_LOG, now=NOW)
    assert {c.status for c in by_name(r, "gpu.model")} == {"fail"}


def test_unsupported_counters_are_skipped_not_passed() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus(ecc_supported=False, remap_supported=False)), CLEAN_LOG, now=NOW)
    assert {c.status for c in by_name(r, "ecc.volatile_uncorrected")} == {"skip"}
    assert {c.status for c in by_name(r, "row_remap")} == {"skip"}
    assert "not supported" in by_name(r, "row_remap")[0].message


def test_ecc_and_remap_findings() -> None:
    g = gpus()
    g[2].volatile_uncorrected = 3
    g[4].remap_pending = True
    g[6].remap_failure = True
    r = run_node_checks(OPTS, FakeNvml(g), CLEAN_LOG, now=NOW)
    fails = {(c.name, c.gpu, c.code) for c in r.checks if c.status == "fail"}
    assert fails == {("ecc.volatile_uncorrected", 2, "DBE"), ("row_remap", 4, "REMAP_PENDING"),
                     ("row_remap", 6, "REMAP_FAILURE")}


def test_no_nvml_is_an_error() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus(), library_present=False), CLEAN_LOG, now=NOW)
    assert r.status == "error" and by_name(r, "nvml.init")[0].status == "error"


def test_unreadable_kernel_log_is_an_error() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus()), None, now=NOW, kernel_log_error="dmesg: permission denied")
    assert by_name(r, "xid")[0].status == "error" and r.status == "error"


def test_xids_map_to_gpus_and_catalogue_actions_within_the_window() -> None:
    log = "\n".join([xid_line(50.0, 3, 79, "GPU has fallen off the bus."),
                     xid_line(5000.0, 1, 13, "Graphics Exception"),
                     xid_line(5001.0, 2, 45, "Preemptive cleanup")])
    r = run_node_checks(OPTS, FakeNvml(gpus()), log, now=NOW, uptime=5100.0)
    xids = {(c.code, c.gpu, c.status) for c in by_name(r, "xid")}
    # XID 45 alone is NVIDIA's solo WORKFLOW_XID_45 (restart Fabric Manager): a warning, not a hold.
    assert ("79", 3, "fail") in xids and ("13", 1, "warn") in xids and ("45", 2, "warn") in xids
    recent = run_node_checks(CheckOptions(node="n1", xid_window=1000), FakeNvml(gpus()), log, now=NOW, uptime=5100.0)
    assert "79" not in {c.code for c in by_name(recent, "xid")}, "an XID outside the window is not counted"


def test_an_xid_logged_before_the_last_passing_sweep_is_not_judged_again() -> None:
    """The kernel log keeps an XID until the node reboots; the sweep passes the time of the node's
    last passing sweep (or GPU reset) as --xid-since, and what came before it was judged already."""
    log = "\n".join([xid_line(50.0, 3, 79, "GPU has fallen off the bus."), xid_line(5000.0, 1, 13, "Graphics")])
    boot = NOW - 5100.0
    opts = CheckOptions.from_argv(["--node", "n1", "--xid-since", str(boot + 4000.0)])
    r = run_node_checks(opts, FakeNvml(gpus()), log, now=NOW, uptime=5100.0)
    assert {c.code for c in by_name(r, "xid")} == {"13"}
    later = CheckOptions(node="n1", xid_since=boot + 5050.0)
    assert [c.status for c in by_name(run_node_checks(later, FakeNvml(gpus()), log, now=NOW, uptime=5100.0),
                                      "xid")] == ["pass"]


def test_check_options_read_a_pods_arguments() -> None:
    o = CheckOptions.from_argv(["--node", "gpu-1", "--expect-gpus", "4", "--gpu-model", "B200", "--json", "--x", "y"])
    assert (o.node, o.expect_gpus, o.gpu_model) == ("gpu-1", 4, "B200")


# -- NVML beyond ECC: NVLink, PCIe, clocks, thermal, power, recovery action -----------------

FULL = CheckOptions(node="n1", expect_gpus=8, gpu_model="H100", expect_nvlinks=18, pcie_gen=5, pcie_width=16,
                    power_limit_w=700)


def statuses(r, name):
    return {c.status for c in by_name(r, name)}


def test_every_nvml_reading_of_a_healthy_gpu_passes() -> None:
    r = run_node_checks(FULL, FakeNvml(gpus()), CLEAN_LOG, now=NOW, uptime=3600)
    assert r.status == "pass"
    for name in ("nvlink.state", "nvlink.errors", "pcie.link", "pcie.replay", "clocks.events", "thermal.margin",
                 "power.limit", "gpu.recovery_action", "gpu.persistence"):
        assert statuses(r, name) == {"pass"}, name
    assert by_name(r, "pcie.link")[0].message.startswith("x16, gen 1 now (max 5)"), "idle gen is not a downtrain"


def test_a_gpu_without_nvlink_or_the_newer_calls_is_skipped_with_a_reason() -> None:
    g = gpus(nvlinks=0, recovery_action=None)
    r = run_node_checks(CheckOptions(node="n1", expect_gpus=8), FakeNvml(g), CLEAN_LOG, now=NOW)
    assert statuses(r, "nvlink.state") == {"skip"} and "no NVLink" in by_name(r, "nvlink.state")[0].message
    assert statuses(r, "gpu.recovery_action") == {"skip"}
    assert r.status == "pass"
    r = run_node_checks(FULL, FakeNvml(gpus(nvlinks=0)), CLEAN_LOG, now=NOW)
    assert statuses(r, "nvlink.state") == {"fail"}, "the profile expects NVLink: its absence fails"


def test_nvlink_errors_warn_and_inactive_links_fail() -> None:
    g = gpus()
    g[1].nvlink_replay = 7
    g[2].nvlink_down = [0, 17]
    g[3].nvlinks = 12  # six links missing against a profile of 18
    r = run_node_checks(FULL, FakeNvml(g), CLEAN_LOG, now=NOW)
    assert {(c.gpu, c.status) for c in by_name(r, "nvlink.errors") if c.status != "pass"} == {(1, "warn")}
    down = {c.gpu: c.message for c in by_name(r, "nvlink.state") if c.status == "fail"}
    assert set(down) == {2, 3} and "2 NVLink link(s) inactive" in down[2] and "6 NVLink" in down[3]


def test_pcie_width_gen_and_replay_rate() -> None:
    g = gpus()
    g[0].pcie_width = 8
    g[1].pcie_max_gen = 4
    g[2].pcie_replays = 1000  # over 10 minutes of uptime: 100 a minute
    r = run_node_checks(FULL, FakeNvml(g), CLEAN_LOG, now=NOW, uptime=600)
    fails = {(c.name, c.gpu, c.code) for c in r.checks if c.status == "fail"}
    assert fails == {("pcie.link", 0, "PCIE_DOWNTRAINED"), ("pcie.link", 1, "PCIE_DOWNTRAINED"),
                     ("pcie.replay", 2, "PCIE_REPLAY")}
    r = run_node_checks(FULL, FakeNvml(gpus(pcie_replays=1000)), CLEAN_LOG, now=NOW, uptime=30 * 86400)
    assert statuses(r, "pcie.replay") == {"pass"}, "the same count over a month is under 8 a minute"


def test_clock_events_thermal_power_and_recovery() -> None:
    g = gpus()
    g[0].clock_reasons = 0x1 | 0x4  # idle and SW power cap: normal
    g[1].clock_reasons = 0x40
    g[2].margin = -3
    g[3].power_limit_mw = 500_000
    g[4].recovery_action = 1
    g[5].recovery_action = 3
    r = run_node_checks(FULL, FakeNvml(g), CLEAN_LOG, now=NOW)
    got = {(c.name, c.gpu, c.status, c.code) for c in r.checks if c.status not in ("pass", "skip")}
    assert got == {("clocks.events", 1, "warn", None), ("thermal.margin", 2, "fail", "THERMAL"),
                   ("power.limit", 3, "warn", None), ("gpu.recovery_action", 4, "fail", "RECOVERY_RESET"),
                   ("gpu.recovery_action", 5, "warn", "RECOVERY_DRAIN_P2P")}
    assert "HW thermal slowdown" in by_name(r, "clocks.events")[1].message


def test_a_lost_gpu_fails_and_the_others_are_still_read() -> None:
    g = gpus()
    g[6].lost = True
    r = run_node_checks(FULL, FakeNvml(g), CLEAN_LOG, now=NOW)
    lost = by_name(r, "gpu.lost")
    assert [(c.gpu, c.code) for c in lost] == [(6, "GPU_LOST")]
    assert len(by_name(r, "row_remap")) == 7


def test_retired_pages_on_a_gpu_without_row_remapping() -> None:
    g = gpus(remap_supported=False)
    g[0].retired_pages = 64
    g[1].retired_pending = True
    r = run_node_checks(CheckOptions(node="n1", expect_gpus=8), FakeNvml(g), CLEAN_LOG, now=NOW)
    fails = {(c.gpu, c.code) for c in by_name(r, "retired_pages") if c.status == "fail"}
    assert fails == {(0, "RETIRED_PAGES"), (1, "RETIRE_PENDING")}


# -- the host: EFA, InfiniBand, MTU, topology, UCCL -------------------------------------------

def efa_host(count: int = 4, **kw) -> FakeHost:
    files = {**efa_sysfs(count, **kw), **netdev("ens32", "ena", 9001), **gpu_pci(8), **peermem()}
    devs = sorted({p.split("/")[4] for p in files if p.startswith("/sys/class/infiniband/")})
    return FakeHost(files=files, commands={"fi_info": (0, fi_info_output(devs), ""),
                                           "nvidia-smi": (0, topo_output(8, 18, 0), "")})


EFA = CheckOptions(node="n1", expect_gpus=8, nic="efa", expect_nics=4, nic_rate_gbps=100, mtu=9001,
                   mtu_driver="ena", expect_nvlinks=18)


def test_a_healthy_efa_host_passes() -> None:
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=efa_host())
    assert r.status == "pass", [(c.name, c.message) for c in r.checks if c.status != "pass"]
    assert {"nic.devices", "nic.port", "efa.fi_info", "net.mtu", "topology.gpu_gpu"} <= {c.name for c in r.checks}


def test_efa_faults() -> None:
    host = efa_host(gpudirect=False)
    host.files["/sys/class/net/ens32/mtu"] = "1500\n"
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    fails = {(c.name, c.code) for c in r.checks if c.status == "fail"}
    assert fails == {("nic.gpudirect", "NO_GPUDIRECT"), ("net.mtu", "MTU")}


def test_efa_port_state_and_rate_are_not_findings() -> None:
    """The EFA driver's port query answers state ACTIVE, phys_state LinkUp and the device's maximum
    link speed, always (github.com/amzn/amzn-drivers, kernel/linux/efa/src/efa_verbs.c,
    efa_query_port, at 64788ef7): neither file can show a link fault, so neither is judged."""
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=efa_host(down=(1,), rate=50))
    assert not [c for c in r.checks if c.code in ("NIC_PORT_DOWN", "NIC_RATE")]
    assert statuses(r, "nic.port") == {"skip"} and r.status == "pass"
    ib = CheckOptions(node="n1", expect_gpus=8, nic="ib", expect_nics=2, nic_rate_gbps=400)
    host = FakeHost(files=ib_sysfs(2, down=(1,), rate=200))
    got = {c.code for c in run_node_checks(ib, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host).checks}
    assert {"NIC_PORT_DOWN", "NIC_RATE"} <= got, "an InfiniBand port's state and rate are the subnet's word: judged"


def test_missing_tools_and_files_are_errors_never_passes() -> None:
    host = efa_host()
    host.commands.clear()
    for p in [p for p in host.files if p.endswith("/ports/1/state")][:1]:
        del host.files[p]
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    errors = {c.name for c in r.checks if c.status == "error"}
    assert {"topology", "nic.port"} <= errors
    assert "nic.port" not in {c.name for c in r.checks if c.status == "pass"}
    assert statuses(r, "efa.fi_info") == {"skip"}, "no fi_info in the image: said, never a pass"
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=FakeHost())
    assert statuses(r, "nic.devices") == {"fail"}, "no /sys/class/infiniband at all: no device"
    assert statuses(r, "net.mtu") == {"error"}, "no interface to read: not a pass"


def test_unknown_uccl_api_is_an_error() -> None:
    opts = CheckOptions(node="n1", expect_gpus=8, uccl="collective_efa,warp_drive")
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=efa_host())
    assert statuses(r, "uccl") == {"error"}


def test_uccl_readiness_per_api() -> None:
    opts = CheckOptions(node="n1", expect_gpus=8, uccl="collective_efa,ep,collective_rdma")
    host = efa_host()
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    ready = {m.name: m.value for m in r.metrics if m.name.startswith("uccl.")}
    assert ready == {"uccl.collective_efa.ready": 1, "uccl.ep.ready": 1, "uccl.p2p.ready": 1,
                     "uccl.collective_afxdp.ready": 1, "uccl.collective_rdma.ready": 0}
    assert statuses(r, "uccl.collective_efa") == {"pass"}
    assert [c.message for c in by_name(r, "uccl.collective_rdma")] == ["no active ConnectX or Thor port"]
    assert not by_name(r, "uccl.env"), "the check pod's own environment says nothing of the workload's"


def test_uccl_ep_on_amd_needs_rocm_7_and_not_arm() -> None:
    amd = {f"/sys/class/drm/card{i}/device/vendor": "0x1002\n" for i in range(8)}
    files = {**amd, **ib_sysfs(8), "/opt/rocm/.info/version": "6.4.1-120\n"}
    opts = CheckOptions(node="n1", expect_gpus=0, uccl="ep")
    r = run_node_checks(opts, FakeNvml([]), CLEAN_LOG, now=NOW, host=FakeHost(files=files))
    assert "ROCm 7" in by_name(r, "uccl.ep")[0].message
    files["/opt/rocm/.info/version"] = "7.1.0\n"
    r = run_node_checks(opts, FakeNvml([]), CLEAN_LOG, now=NOW, host=FakeHost(files=files))
    assert statuses(r, "uccl.ep") == {"pass"}
    r = run_node_checks(opts, FakeNvml([]), CLEAN_LOG, now=NOW, host=FakeHost(files=files, arch="aarch64"))
    assert "ARM64" in by_name(r, "uccl.ep")[0].message


def test_gpu_memory_against_the_profile() -> None:
    g = gpus()
    g[3].memory_mib = 40960  # a 40 GB part where the profile expects 80
    r = run_node_checks(CheckOptions(node="n1", expect_gpus=8, gpu_memory_gb=80), FakeNvml(g), CLEAN_LOG, now=NOW)
    assert {(c.gpu, c.code) for c in by_name(r, "gpu.memory") if c.status == "fail"} == {(3, "GPU_MEMORY")}
    assert len([c for c in by_name(r, "gpu.memory") if c.status == "pass"]) == 7
    r = run_node_checks(CheckOptions(node="n1", expect_gpus=8), FakeNvml(g), CLEAN_LOG, now=NOW)
    assert by_name(r, "gpu.memory") == [], "no expectation, no check"


def test_the_real_host_reads_a_mounted_root(tmp_path, monkeypatch) -> None:
    """RealHost under a root, as in a check Job that mounts the host's /sys and journal directories
    under /host: sysfs files on disk, and the image's own programs (a stand-in fi_info on PATH here)."""
    import os
    import stat

    from sweeper.checks.host import RealHost

    files = {**efa_sysfs(4), **netdev("ens32", "ena", 9001)}
    for path, text in files.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    devs = sorted({p.split("/")[4] for p in files if p.startswith("/sys/class/infiniband/")})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    out = tmp_path / "fi_info.out"
    out.write_text(fi_info_output(devs))
    tool = bin_dir / "fi_info"
    tool.write_text(f'#!/bin/sh\ncat {out}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    opts = CheckOptions(node="n1", expect_gpus=8, nic="efa", expect_nics=4, nic_rate_gbps=100, mtu=9001,
                        mtu_driver="ena")
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=RealHost(str(tmp_path)))
    assert r.status == "pass", [(c.name, c.message) for c in r.checks if c.status != "pass"]
    assert {"nic.devices", "nic.port", "efa.fi_info", "net.mtu"} <= {c.name for c in r.checks}
    os.remove(tmp_path / "sys/class/net/ens32/mtu")
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=RealHost(str(tmp_path)))
    assert statuses(r, "net.mtu") == {"error"}


def test_an_unprivileged_check_skips_what_it_cannot_read() -> None:
    """The light check runs as a user without CAP_SYSLOG: it is told not to read the kernel log,
    and a reading NVML refuses for permission (NVML_ERROR_NO_PERMISSION) is skip with the
    reason, never a pass and never an error that fails the node."""
    import pynvml

    class Unprivileged(FakeNvml):
        def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    opts = CheckOptions(node="n1", expect_gpus=8, gpu_model="H100", skip_kernel_log="runs unprivileged")
    r = run_node_checks(opts, Unprivileged(gpus()), None, now=NOW, uptime=100)
    assert [(c.status, c.message) for c in by_name(r, "xid")] == [("skip", "kernel log not read: runs unprivileged")]
    remap = by_name(r, "row_remap")
    assert {c.status for c in remap} == {"skip"} and "unprivileged" in remap[0].message
    assert r.status == "pass", "skips do not fail the node; the readings that came back passed"
    assert CheckOptions.from_argv(["--skip-kernel-log", "why"]).skip_kernel_log == "why"


# -- each platform: GPUs a pod did not request, the host's own tools, the journal, UCCL -----------

def test_a_light_check_that_sees_no_gpu_says_it_cannot_read_the_node() -> None:
    """A pod that requests no GPU sees GPUs only through NVIDIA's runtime and
    NVIDIA_VISIBLE_DEVICES=all (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/
    docker-specialized.html); GKE's device plugin gives devices only to pods that request them
    (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus). Zero GPUs there is the runtime's
    doing: an error with the reason, never a node that lost its GPUs, never a pass."""
    light = CheckOptions(node="n1", expect_gpus=8, gpu_request="none", skip_kernel_log="unprivileged")
    r = run_node_checks(light, FakeNvml([]), None, now=NOW)
    assert statuses(r, "gpu.count") == {"error"} and r.status == "error"
    assert "requests no GPU" in by_name(r, "gpu.count")[0].message
    r = run_node_checks(light, FakeNvml(gpus(), library_present=False), None, now=NOW)
    assert r.status == "error" and "runtime_class" in by_name(r, "nvml.init")[0].message
    # A check that holds every GPU and sees none is still a node that lost them.
    r = run_node_checks(OPTS, FakeNvml([]), CLEAN_LOG, now=NOW)
    assert statuses(r, "gpu.count") == {"fail"}


def test_the_hosts_fi_info_is_not_run_and_efa_is_judged_from_sysfs() -> None:
    """The EFA installer's fi_info loads the host's libfabric from /opt/amazon/efa and the host's
    rdma-core (libibverbs, libefa) from its system library directories, and opens /dev/infiniband
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html); the check Job mounts none of
    them and has no CAP_SYS_CHROOT. With no fi_info in the image, `efa.fi_info` is skip with that
    reason (never a pass, never the node's fault), and nic.devices judges the devices from sysfs."""
    host = efa_host()
    del host.commands["fi_info"]
    host.files["/opt/amazon/efa/bin/fi_info"] = "ELF"  # where the host's lies: not reachable from the Job
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert statuses(r, "efa.fi_info") == {"skip"} and "/opt/amazon/efa" in by_name(r, "efa.fi_info")[0].message
    assert TOOL_CHECK not in {c.name for c in r.checks} and r.status == "pass"
    assert not [a for a in host.ran if a[0] == "chroot" or "/opt/amazon/efa/bin/fi_info" in a], host.ran
    assert statuses(r, "nic.devices") == {"pass"}
    host = efa_host(count=3)  # a device gone: sysfs still tells, with fi_info unread
    del host.commands["fi_info"]
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert {(c.name, c.code) for c in r.checks if c.status == "fail"} == {("nic.devices", "NIC_COUNT")}


def test_a_missing_efa_tool_is_a_tool_finding_not_an_error_of_the_node() -> None:
    """An image's fi_info that does not run (a library that does not load), or a libfabric that opens
    none of the devices the EFA driver lists (the pod has no /dev/infiniband): each is `check.tool`, a
    skip, so a p4d/p5 sweep still judges the node on sysfs and never ends `error` for it."""
    host = efa_host()
    host.commands["fi_info"] = (1, fi_info_output([]), "")  # fi_getinfo: -61, while sysfs lists 4
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert statuses(r, TOOL_CHECK) == {"skip"} and r.status == "pass"
    host.commands["fi_info"] = (127, "", "fi_info: error while loading shared libraries: libfabric.so.1\n")
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert by_name(r, TOOL_CHECK)[0].code == "fi_info exit 127" and r.status == "pass"
    # A device the EFA driver lists and libfabric cannot open, beside ones it can, is the node's.
    host = efa_host()
    host.commands["fi_info"] = (0, fi_info_output(["rdmap16s27"]), "")
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert statuses(r, "efa.fi_info") == {"fail"}


BOOT = "5b2f3c1e9a8d4f60b7e2a1c3d4e5f607"
MACHINE = "/var/log/journal/0123456789abcdef0123456789abcdef"


def journal_host(**files: str) -> FakeHost:
    """A check pod with the image's journalctl and the host's journal files under its mounts."""
    return FakeHost(files=dict(files), commands={"journalctl": (0, "", "")}, boot=BOOT)


def test_xids_the_ring_buffer_lost_are_read_from_the_journal() -> None:
    """journald keeps the kernel's lines after the ring buffer has overwritten them; `journalctl -k
    -o short-monotonic` stamps them with seconds since boot like dmesg, and `--root` reads the journal
    directories below a root, /var/log/journal and /run/log/journal, as the check Job mounts them
    (https://www.freedesktop.org/software/systemd/man/latest/journalctl.html), so one XID is seen
    once, and one the ring buffer lost within the window is seen at all. `-b` takes the running
    kernel's boot ID: the boot before it, in the same directory, is not judged again."""
    old = xid_line(1000.0, 3, 79, "GPU has fallen off the bus.")
    new = xid_line(5000.0, 5, 13, "Graphics Exception")
    before = xid_line(4000.0, 1, 48, "An uncorrectable double bit error")
    ring = new + "\n"
    host = journal_host(**{f"{MACHINE}/system.journal": journal_file(BOOT, "n1", [old, new]),
                           f"{MACHINE}/system@a.journal": journal_file("f" * 32, "n1", [before])})
    r = run_node_checks(OPTS, FakeNvml(gpus()), ring, now=NOW, uptime=6000, host=host)
    assert {(c.code, c.gpu) for c in by_name(r, "xid")} == {("79", 3), ("13", 5)}
    assert [m.value for m in r.metrics if m.name == "xid.count" and m.gpu == 5] in ([], [1.0])
    argv = host.ran[-1]
    assert argv[:3] == ["journalctl", "--root=/", "-k"] and argv[argv.index("-b") + 1] == BOOT
    assert by_name(r, "xid.journal") == [] and r.status == "fail"
    # The volatile journal (/run/log/journal) alone is read the same way.
    host = journal_host(**{"/run/log/journal/0123/system.journal": journal_file(BOOT, "n1", [old])})
    r = run_node_checks(OPTS, FakeNvml(gpus()), ring, now=NOW, uptime=6000, host=host)
    assert {c.code for c in by_name(r, "xid")} == {"79", "13"}


def test_a_journal_that_cannot_be_read_is_said_and_the_ring_buffer_still_judged() -> None:
    """No journal files (journald's Storage=none, or directories the runtime bound empty), no
    journalctl in the image, no boot ID, or a journal written by a newer systemd whose format the
    image's journalctl does not read (it skips the file: "uses an unsupported feature", systemd's
    src/shared/journal-util.c): each is `xid.journal` skip with the reason, never a clean journal, and
    the ring buffer is still judged."""
    old = xid_line(1000.0, 3, 79, "GPU has fallen off the bus.")
    new = xid_line(5000.0, 5, 13, "Graphics Exception")
    ring = new + "\n"
    newer = journal_file(BOOT, "n1", [old], fmt=JOURNALCTL_FORMAT + 1)
    cases = {
        "keeps no journal files": journal_host(),
        "not in the check image": FakeHost(files={f"{MACHINE}/system.journal": journal_file(BOOT, "n1", [old])},
                                           boot=BOOT),
        "boot ID is unreadable": FakeHost(files={f"{MACHINE}/system.journal": journal_file(BOOT, "n1", [old])},
                                          commands={"journalctl": (0, "", "")}),
        "format newer than the image's journalctl": journal_host(**{f"{MACHINE}/system.journal": newer}),
    }
    for why, host in cases.items():
        r = run_node_checks(OPTS, FakeNvml(gpus()), ring, now=NOW, uptime=6000, host=host)
        assert {c.code for c in by_name(r, "xid")} == {"13"}, why
        (journal,) = by_name(r, "xid.journal")
        assert journal.status == "skip" and why in journal.message, (why, journal.message)
    # Newer files beside readable ones: what could be read is judged, and the rest is said.
    host = journal_host(**{f"{MACHINE}/system.journal": journal_file(BOOT, "n1", [old]),
                           f"{MACHINE}/system@b.journal": newer})
    r = run_node_checks(OPTS, FakeNvml(gpus()), ring, now=NOW, uptime=6000, host=host)
    assert {c.code for c in by_name(r, "xid")} == {"79", "13"}
    assert "partly unread" in by_name(r, "xid.journal")[0].message


def test_the_real_host_runs_the_images_journalctl_over_the_mounted_journal(tmp_path, monkeypatch) -> None:
    """Under a root (/host in the check Job), the journal directories are looked for below it, and
    journalctl is the image's, on PATH, told `--root` of that same root and this kernel's boot ID
    (a stand-in here that prints the lines only for those arguments)."""
    import os
    import stat

    from sweeper.checks.host import RealHost

    root = tmp_path / "host"
    (root / "var/log/journal/0123").mkdir(parents=True)
    (root / "var/log/journal/0123/system.journal").write_bytes(b"LPKSHHRH")
    boot = RealHost(str(root)).boot_id()
    old = xid_line(1000.0, 3, 79, "GPU has fallen off the bus.")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "journalctl"
    tool.write_text(f'#!/bin/sh\ncase "$*" in *"--root={root} -k -b {boot} "*) echo "{journal_line("n1", old)}";;\n'
                    '*) echo "unexpected: $*" >&2; exit 2;; esac\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ring = xid_line(5000.0, 5, 13, "Graphics Exception") + "\n"
    r = run_node_checks(OPTS, FakeNvml(gpus()), ring, now=NOW, uptime=6000, host=RealHost(str(root)))
    assert {c.code for c in by_name(r, "xid")} == {"79", "13"}, [(c.name, c.message) for c in r.checks]
    assert by_name(r, "xid.journal") == []
    (root / "var/log/journal/0123/system.journal").unlink()
    (root / "var/log/journal/0123").rmdir()  # what the runtime binds where the host keeps none: empty
    r = run_node_checks(OPTS, FakeNvml(gpus()), ring, now=NOW, uptime=6000, host=RealHost(str(root)))
    assert "no journal files" in by_name(r, "xid.journal")[0].message


def test_the_real_host_reads_the_kernels_boot_id() -> None:
    """The boot ID is the kernel's (/proc/sys/kernel/random/boot_id, not namespaced, so a pod reads
    its host's: https://docs.kernel.org/admin-guide/sysctl/kernel.html#random), as journalctl's `-b`
    takes it: 32 hex digits."""
    import re
    from pathlib import Path

    from sweeper.checks.host import BOOT_ID, RealHost

    got = RealHost("/nonexistent").boot_id()
    assert got == Path(BOOT_ID).read_text().strip().replace("-", "") and re.fullmatch(r"[0-9a-f]{32}", got)


def test_uccl_readiness_is_judged_on_the_nodes_gpudirect_and_affinity() -> None:
    """UCCL's RDMA paths need GPUDirect RDMA on the node (a peer-memory module such as the EFA
    installer's efa_nv_peermem or NVIDIA's nvidia_peermem, or dma-buf with the open GPU kernel
    modules: https://docs.nvidia.com/cuda/gpudirect-rdma/, github.com/uccl-project/uccl efa/README.md),
    user-space verbs devices, and a NIC near each GPU; the check pod's variables do not matter."""
    opts = CheckOptions(node="n1", expect_gpus=8, uccl="collective_efa,p2p")
    host = efa_host()
    del host.files["/sys/module/efa_nv_peermem/initstate"]
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert statuses(r, "uccl.collective_efa") == {"fail"} and "GPUDirect" in by_name(r, "uccl.p2p")[0].message
    host.files["/proc/driver/nvidia/version"] = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20\n"
    host.files["/proc/sys/kernel/osrelease"] = "6.1.134-152.225.amzn2023.x86_64\n"
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert statuses(r, "uccl.collective_efa") == {"pass"}, "dma-buf is GPUDirect RDMA too"
    host = efa_host()
    for p in [p for p in host.files if p.endswith("/device/numa_node") and "infiniband" in p]:
        host.files[p] = "0\n"  # every NIC on socket 0: the GPUs of socket 1 reach them across it
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert statuses(r, "uccl.p2p") == {"fail"} and "NUMA" in by_name(r, "uccl.p2p")[0].message
    host = efa_host()
    for p in [p for p in host.files if "/infiniband_verbs/" in p]:
        del host.files[p]  # no user-space verbs device: nothing an RDMA library can open
    r = run_node_checks(opts, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    assert statuses(r, "uccl.collective_efa") == {"fail"}


def test_a_gpu_fabric_manager_has_not_registered_fails() -> None:
    """On HGX Hopper and later, Fabric Manager registers each GPU with the NVSwitch fabric; until
    NVML's fabric state is completed with success, CUDA cannot use NVLink there
    (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/). A GPU without a fabric
    to join (the A100's NVML does not report it) is not judged."""
    g = gpus(fabric_state=3)
    g[2].fabric_state = 1  # not started: Fabric Manager is down
    g[5].fabric_status = 999  # completed, but with an error
    r = run_node_checks(OPTS, FakeNvml(g), "", now=NOW)
    fails = {(c.gpu, c.code) for c in by_name(r, "gpu.fabric") if c.status == "fail"}
    assert fails == {(2, "FABRIC_NOT_READY"), (5, "FABRIC_NOT_READY")}
    assert "Fabric Manager" in next(c.message for c in by_name(r, "gpu.fabric") if c.gpu == 2)
    assert len([c for c in by_name(r, "gpu.fabric") if c.status == "pass"]) == 6
    assert by_name(run_node_checks(OPTS, FakeNvml(gpus()), CLEAN_LOG, now=NOW), "gpu.fabric") == []


