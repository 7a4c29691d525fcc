"""The node-local checks against the fake NVML (the same backend the simulated kubelet uses)."""

from sweeper.checks import run_node_checks
from sweeper.checks.fake import (
    FakeGpu,
    FakeHost,
    FakeNvml,
    bus_id,
    efa_sysfs,
    fi_info_output,
    ib_sysfs,
    netdev,
    topo_output,
    xid_line,
)
from sweeper.checks.options import CheckOptions

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
    assert ("79", 3, "fail") in xids and ("13", 1, "warn") in xids and ("45", 2, "pass") in xids
    recent = run_node_checks(CheckOptions(node="n1", xid_window=1000), FakeNvml(gpus()), log, now=NOW, uptime=5100.0)
    assert "79" not in {c.code for c in by_name(recent, "xid")}, "an XID outside the window is not counted"


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
    files = {**efa_sysfs(count, **kw), **netdev("ens32", "ena", 9001)}
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
    host = efa_host(down=(1,), rate=50, gpudirect=False)
    host.files["/sys/class/net/ens32/mtu"] = "1500\n"
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    fails = {(c.name, c.code) for c in r.checks if c.status == "fail"}
    assert fails == {("nic.port", "NIC_PORT_DOWN"), ("nic.rate", "NIC_RATE"), ("nic.gpudirect", "NO_GPUDIRECT"),
                     ("net.mtu", "MTU")}


def test_missing_tools_and_files_are_errors_never_passes() -> None:
    host = efa_host()
    host.commands.clear()
    for p in [p for p in host.files if p.endswith("/ports/1/state")][:1]:
        del host.files[p]
    r = run_node_checks(EFA, FakeNvml(gpus()), CLEAN_LOG, now=NOW, host=host)
    errors = {c.name for c in r.checks if c.status == "error"}
    assert {"efa.fi_info", "topology", "nic.port"} <= errors
    assert "nic.port" not in {c.name for c in r.checks if c.status == "pass"}
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
    assert statuses(r, "uccl.env") == {"warn"}, "UCCL_SOCKET_IFNAME and UCCL_IB_GID_INDEX are unset"


def test_uccl_ep_on_amd_needs_rocm_7_and_not_arm() -> None:
    amd = {f"/sys/class/drm/card{i}/device/vendor": "0x1002\n" for i in range(8)}
    files = {**amd, **ib_sysfs(8), "/opt/rocm/.info/version": "6.4.1-120\n"}
    opts = CheckOptions(node="n1", expect_gpus=0, uccl="ep")
    env = {"UCCL_SOCKET_IFNAME": "eth0", "UCCL_IB_GID_INDEX": "3"}
    r = run_node_checks(opts, FakeNvml([]), CLEAN_LOG, now=NOW, host=FakeHost(files=files, environ=env))
    assert "ROCm 7" in by_name(r, "uccl.ep")[0].message
    files["/opt/rocm/.info/version"] = "7.1.0\n"
    r = run_node_checks(opts, FakeNvml([]), CLEAN_LOG, now=NOW, host=FakeHost(files=files, environ=env))
    assert statuses(r, "uccl.ep") == {"pass"} and statuses(r, "uccl.env") == {"pass"}
    r = run_node_checks(opts, FakeNvml([]), CLEAN_LOG, now=NOW, host=FakeHost(files=files, environ=env, arch="aarch64"))
    assert "ARM64" in by_name(r, "uccl.ep")[0].message


def test_gpu_memory_against_the_profile() -> None:
    g = gpus()
    g[3].memory_mib = 40960  # a 40 GB part where the profile expects 80
    r = run_node_checks(CheckOptions(node="n1", expect_gpus=8, gpu_memory_gb=80), FakeNvml(g), CLEAN_LOG, now=NOW)
    assert {(c.gpu, c.code) for c in by_name(r, "gpu.memory") if c.status == "fail"} == {(3, "GPU_MEMORY")}
    assert len([c for c in by_name(r, "gpu.memory") if c.status == "pass"]) == 7
    r = run_node_checks(CheckOptions(node="n1", expect_gpus=8), FakeNvml(g), CLEAN_LOG, now=NOW)
    assert by_name(r, "gpu.memory") == [], "no expectation, no check"


def test_the_real_host_reads_a_mounted_root(tmp_path) -> None:
    """RealHost under a root, as in a check Job that mounts the host's /sys and /opt at /host:
    sysfs files on disk, and the host's own fi_info run with the host's libfabric."""
    import os
    import stat

    from sweeper.checks.host import RealHost

    files = {**efa_sysfs(4), **netdev("ens32", "ena", 9001)}
    for path, text in files.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    devs = sorted({p.split("/")[4] for p in files if p.startswith("/sys/class/infiniband/")})
    tool = tmp_path / "opt/amazon/efa/bin/fi_info"
    tool.parent.mkdir(parents=True)
    out = tmp_path / "fi_info.out"
    out.write_text(fi_info_output(devs))
    tool.write_text(f'#!/bin/sh\ncase "$LD_LIBRARY_PATH" in *{tmp_path}/opt/amazon/efa/lib*) ;; *) exit 9;; esac\n'
                    f'cat {out}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
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
