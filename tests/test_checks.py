"""The node-local checks against the fake NVML (the same backend the simulated kubelet uses)."""

from sweeper.checks import run_node_checks
from sweeper.checks.fake import FakeGpu, FakeNvml, bus_id, xid_line
from sweeper.checks.options import CheckOptions

NOW = 1_790_000_000.0
OPTS = CheckOptions(node="n1", expect_gpus=8, gpu_model="H100")


def gpus(n: int = 8, **faults: object) -> list[FakeGpu]:
    return [FakeGpu(index=i, bus_id=bus_id(i), **faults) for i in range(n)]  # type: ignore[arg-type]


def by_name(result, name):
    return [c for c in result.checks if c.name == name]


def test_a_healthy_node_passes_every_check() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus()), "", now=NOW, uptime=100)
    assert r.status == "pass"
    assert {c.name for c in r.checks} >= {"gpu.count", "gpu.model", "ecc.volatile_uncorrected", "row_remap", "xid"}
    assert len(by_name(r, "row_remap")) == 8


def test_a_missing_gpu_fails_the_count() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus(7)), "", now=NOW)
    assert by_name(r, "gpu.count")[0].status == "fail" and "7 GPUs visible" in by_name(r, "gpu.count")[0].message


def test_wrong_model_fails() -> None:
    r = run_node_checks(OPTS, FakeNvml([FakeGpu(i, name="NVIDIA A100-SXM4-40GB", bus_id=bus_id(i)) for i in range(8)]),
                        "", now=NOW)
    assert {c.status for c in by_name(r, "gpu.model")} == {"fail"}


def test_unsupported_counters_are_skipped_not_passed() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus(ecc_supported=False, remap_supported=False)), "", now=NOW)
    assert {c.status for c in by_name(r, "ecc.volatile_uncorrected")} == {"skip"}
    assert {c.status for c in by_name(r, "row_remap")} == {"skip"}
    assert "not supported" in by_name(r, "row_remap")[0].message


def test_ecc_and_remap_findings() -> None:
    g = gpus()
    g[2].volatile_uncorrected = 3
    g[4].remap_pending = True
    g[6].remap_failure = True
    r = run_node_checks(OPTS, FakeNvml(g), "", now=NOW)
    fails = {(c.name, c.gpu, c.code) for c in r.checks if c.status == "fail"}
    assert fails == {("ecc.volatile_uncorrected", 2, "DBE"), ("row_remap", 4, "REMAP_PENDING"),
                     ("row_remap", 6, "REMAP_FAILURE")}


def test_no_nvml_is_an_error() -> None:
    r = run_node_checks(OPTS, FakeNvml(gpus(), library_present=False), "", now=NOW)
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
