"""fi_info, nvidia-smi topo -m, ibv_devinfo and nvidia-smi (-q and CSV): one fixture per output
shape, and bad input of every kind to every parser gives `error`, never a pass.

The fixtures are built from the layouts NVIDIA, AWS and the rdma-core tools document (and the
captures quoted in the project's reference notes), not captured on a GPU node."""

from pathlib import Path

import pytest

from sweeper.parsers import dcgm, fi_info, ibv_devinfo, nccl, nvidia_smi, sweeper_result, topo
from sweeper.parsers.topo import parse_matrix

FIX = Path(__file__).parent / "fixtures"
NOW = 1_800_000_000.0


def read(name: str) -> str:
    return (FIX / name).read_text()


def fails(r):
    return {(c.name, c.gpu, c.code) for c in r.checks if c.status == "fail"}


# -- fi_info -----------------------------------------------------------------------------

def test_fi_info_counts_devices_not_provider_lines() -> None:
    text = read("fi-info-libfabric1-p4d.txt")
    assert text.count("provider: efa") == 8
    assert fi_info.efa_devices(text) == ["rdmap144s27", "rdmap160s27", "rdmap16s27", "rdmap32s27"]
    assert fi_info.parse(text, "n", NOW, expect=4).status == "pass"
    r = fi_info.parse(text, "n", NOW, expect=32)
    assert fails(r) == {("efa.fi_info", None, "EFA_COUNT")}


def test_fi_info_libfabric2_efa_direct_counts_once() -> None:
    r = fi_info.parse(read("fi-info-libfabric2-p5en.txt"), "n", NOW, expect=16)
    assert r.status == "pass" and r.metrics[0].value == 16


def test_fi_info_no_device_fails() -> None:
    r = fi_info.parse(read("fi-info-none.txt"), "n", NOW, expect=4, exit_code=1)
    assert fails(r) == {("efa.fi_info", None, "EFA_NONE")}


# -- nvidia-smi topo -m ------------------------------------------------------------------

def test_topo_p5_all_nvlink_and_no_nics() -> None:
    t = parse_matrix(read("topo-p5-h100.txt"))
    assert t is not None and t.gpus == [f"GPU{i}" for i in range(8)] and t.link("GPU0", "GPU7") == "NV18"
    r = topo.parse(read("topo-p5-h100.txt"), "n", NOW, nvlinks=18, nic_affinity="PXB")
    assert r.status == "pass"
    assert [c.status for c in r.checks if c.name == "topology.gpu_nic"] == ["skip"], "no NIC columns: not a pass"


def test_topo_nd_h100_v5_every_gpu_near_a_nic() -> None:
    r = topo.parse(read("topo-nd-h100-v5.txt"), "n", NOW, nvlinks=18, nic_affinity="PXB")
    assert r.status == "pass"
    assert sum(1 for c in r.checks if c.name == "topology.gpu_nic" and c.status == "pass") == 8
    assert "mlx5_3" in next(c.message for c in r.checks if c.gpu == 3)


def test_topo_poor_affinity_fails_each_gpu() -> None:
    r = topo.parse(read("topo-poor-affinity.txt"), "n", NOW, nic_affinity="PXB")
    assert {code for _n, _g, code in fails(r)} == {"NIC_AFFINITY"} and len(fails(r)) == 8


def test_topo_merged_tabs_are_split() -> None:
    t = parse_matrix(read("topo-merged-tabs.txt"))
    assert t is not None and t.rows["GPU5"][8:12] == ["SYS", "SYS", "SYS", "SYS"]
    assert topo.parse(read("topo-merged-tabs.txt"), "n", NOW, nvlinks=18, nic_affinity="PXB").status == "pass"


def test_topo_a100_against_an_nvlink_profile() -> None:
    assert topo.parse(read("topo-a100-nv12.txt"), "n", NOW, nvlinks=12).status == "pass"
    text = read("topo-a100-nv12.txt").replace("NV12", "SYS", 1)
    assert fails(topo.parse(text, "n", NOW, nvlinks=12)) == {("topology.gpu_gpu", None, "NVLINK_TOPOLOGY")}


# -- ibv_devinfo -------------------------------------------------------------------------

def test_ibv_devinfo_efa() -> None:
    r = ibv_devinfo.parse(read("ibv-devinfo-efa.txt"), "n", NOW, expect=2, kind="efa")
    assert r.status == "pass"
    devs = ibv_devinfo.devices(read("ibv-devinfo-efa.txt"))
    assert devs is not None and devs[0].ports[0].active_mtu == 4096 and devs[0].kind == "efa"


def test_ibv_devinfo_efa_count_is_judged_and_its_port_state_is_not() -> None:
    """The EFA driver answers every port query with state ACTIVE and the device's maximum rate
    (github.com/amzn/amzn-drivers, kernel/linux/efa/src/efa_verbs.c, efa_query_port): a port
    state in ibv_devinfo's EFA output says nothing of the link, so it is no finding."""
    r = ibv_devinfo.parse(read("ibv-devinfo-efa-port-down.txt"), "n", NOW, expect=4, kind="efa")
    assert fails(r) == {("rdma.devices", None, "NIC_COUNT")}
    assert {c.status for c in r.checks if c.name == "rdma.port"} == {"skip"}


def test_ibv_devinfo_connectx_is_not_efa() -> None:
    assert ibv_devinfo.parse(read("ibv-devinfo-connectx.txt"), "n", NOW, expect=1, kind="ib").status == "pass"
    assert ibv_devinfo.parse(read("ibv-devinfo-connectx.txt"), "n", NOW, kind="efa").status == "fail"


# -- nvidia-smi -q and CSV ---------------------------------------------------------------

def test_smi_q_healthy_h100() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-q-h100-healthy.txt"), "n", NOW, expect_gpus=2, gpu_model="H100")
    assert r.status == "pass" and r.source == "nvidia-smi"
    m = {(x.name, x.gpu): x.value for x in r.metrics}
    assert m[("ecc.aggregate_corrected", 0)] == 1840 and m[("gpu.thermal_margin", 1)] == 41
    assert m[("gpu.power", 0)] == 71.52 and m[("row_remap.corrected", 1)] == 3


def test_smi_q_faults() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-q-h100-faulty.txt"), "n", NOW, expect_gpus=8)
    assert fails(r) == {("gpu.count", None, None), ("row_remap", 0, "REMAP_PENDING"), ("ecc.volatile_uncorrected", 1, "DBE"),
                        ("pcie.link", 1, "PCIE_DOWNTRAINED"), ("thermal.margin", 2, "THERMAL")}
    assert [c.message for c in r.checks if c.name == "clocks.events"] == ["active: HW slowdown"]


def test_smi_q_older_driver_layout() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-q-a100-driver470.txt"), "n", NOW, expect_gpus=1, gpu_model="A100")
    assert r.status == "warn", "SW thermal slowdown warns"
    m = {x.name: x.value for x in r.metrics}
    assert m["ecc.aggregate_corrected"] == 27 and m["gpu.power"] == 56.58


def test_smi_q_v100_retired_pages_and_old_ecc_layout() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-q-v100-retired-pages.txt"), "n", NOW)
    assert fails(r) == {("ecc.volatile_uncorrected", 0, "DBE"), ("retired_pages", 0, "RETIRE_PENDING"),
                        ("retired_pages", 0, "RETIRED_PAGES")}
    assert [c.status for c in r.checks if c.name == "row_remap"] == ["skip"]


def test_smi_csv() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-h100.txt"), "n", NOW, expect_gpus=3)
    assert r.source == "nvidia-smi"
    assert fails(r) == {("row_remap", 1, "REMAP_PENDING"), ("pcie.link", 2, "PCIE_DOWNTRAINED")}


def test_smi_csv_not_supported_is_skip_never_zero() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-not-supported.txt"), "n", NOW)
    geforce = [c for c in r.checks if c.gpu == 1]
    assert {c.status for c in geforce} == {"skip"}


@pytest.mark.parametrize("name", ["nvidia-smi-q-truncated.txt", "nvidia-smi-csv-noheader.txt"])
def test_smi_truncated_or_headerless_is_an_error(name: str) -> None:
    assert nvidia_smi.parse(read(name), "n", NOW).status == "error"


# -- bad input to every parser -----------------------------------------------------------

PARSERS = {
    "fi_info": lambda t: fi_info.parse(t, "n", NOW, expect=4),
    "topo": lambda t: topo.parse(t, "n", NOW, nvlinks=18, nic_affinity="PXB"),
    "ibv_devinfo": lambda t: ibv_devinfo.parse(t, "n", NOW, expect=2),
    "nvidia_smi": lambda t: nvidia_smi.parse(t, "n", NOW, expect_gpus=8),
    "dcgm": lambda t: dcgm.parse(t, "n", NOW, exit_code=0),
    "nccl": lambda t: nccl.parse(t, "n", NOW, min_busbw=400),
    "sweeper": lambda t: sweeper_result.parse(t, "n", NOW),
}
BAD = {
    "empty": "",
    "blank": "   \n\n",
    "garbage": "NVRM: API mismatch\x1b[0m ]]} <<garbage>> 0xdeadbeef\n\x00\x01",
    "binary": bytes(range(256)).decode("latin-1") * 4,
    "gigantic": "x" * (17 * 1024 * 1024),
    "json-of-the-wrong-kind": '{"hello": "world"}',
}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_bad_input_is_an_error_never_a_pass(parser: str, bad: str) -> None:
    r = PARSERS[parser](BAD[bad])
    assert r.status == "error", (parser, bad, r.status, [c.message for c in r.checks])
    assert not any(c.status == "pass" for c in r.checks)


def test_truncated_topology_is_an_error() -> None:
    assert PARSERS["topo"](read("topo-truncated.txt")).status == "error"
