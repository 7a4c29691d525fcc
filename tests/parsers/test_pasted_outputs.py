"""nvidia-smi, ibv_devinfo, fi_info and topo output as people paste it: prompts, runner prefixes,
elisions, one -q section with no GPU line, the other CSV queries, grep-filtered ibv_devinfo; and
every reader says `error` for what it cannot recognise, whatever is thrown at it.

The fixtures used here are written for these tests (`tests/parsers/fixtures/`, not `real/`), in the
layouts the tools document:
- nvidia-smi(1), "-d, --display" (one section per GPU) and the `--query-retired-pages`,
  `--query-remapped-rows`, `--query-compute-apps` options, with `nvidia-smi --help-query-gpu` for
  the field names (`gpu_name` is printed as `name`, `gpu_bus_id` as `pci.bus_id`);
- NVIDIA's "Dynamic Page Retirement" (https://docs.nvidia.com/deploy/dynamic-page-retirement/index.html)
  for the retired-page limit and the pending blacklist;
- NVIDIA's "A100 GPU Memory Error Management" (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html)
  for row remapping pending and failure, and SRAM uncorrectable errors;
- Ansible's oneline callback (https://docs.ansible.com/ansible/latest/collections/ansible/builtin/oneline_callback.html):
  `host | CHANGED | rc=0 | (stdout) ...` with the output's newlines escaped as `\\n`;
- rdma-core's ibv_devinfo(1) and infiniband-diags' ibstat(8) for port and physical states;
  the InfiniBand specification's port state machine (a port leaves Down for Active only through a
  subnet manager) for PORT_DOWN with LINK_UP;
- fi_getinfo(3): no matching provider is -FI_ENODATA, printed as -61.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeper.ingest import detect, ingest
from sweeper.parsers import dcgm, fi_info, ibv_devinfo, nvidia_smi, topo
from sweeper.parsers.paste import clean

FIX = Path(__file__).parent / "fixtures"
NOW = 1_800_000_000.0


def read(name: str) -> str:
    return (FIX / name).read_text()


def bad(r) -> set[tuple[str, int | None, str | None]]:
    return {(c.name, c.gpu, c.code) for c in r.checks if c.status == "fail"}


# -- what surrounds a paste -----------------------------------------------------------------

def test_a_paste_loses_its_prompt_its_runner_prefix_and_its_elisions_but_remembers_them() -> None:
    p = clean(read("nvidia-smi-csv-ansible-oneline.txt"))
    assert p.prefixed and p.lines[0].startswith("index, name, pci.bus_id") and len([x for x in p.lines if x]) == 3
    p = clean(read("nvidia-smi-csv-prompt-na.txt"))
    assert p.command.startswith("nvidia-smi --query-gpu") and p.elided and p.lines[0].startswith("name, ")
    p = clean("gpu-1: hca_id:\tmlx5_0\ngpu-1: \t\tport:\t1\ngpu-1: \t\t\tstate:\t\t\tPORT_ACTIVE (4)\n")
    assert p.lines[0] == "hca_id:\tmlx5_0", "pdsh's host: prefix, the same on every line, comes off"
    assert clean("fi_getinfo: -61 (No data available)\n").lines[0].startswith("fi_getinfo"), \
        "one `word: ` line is output, not a pdsh prefix"


def test_mpirun_tag_output_and_kubectl_timestamps_come_off_every_line() -> None:
    """Open MPI's `--tag-output` (mpirun(1)) and `kubectl logs --timestamps` (RFC 3339 before each
    line) wrap a whole output; with them off, the reader sees the tool's own lines."""
    tagged = "".join(f"[1,0]<stdout>:{ln}\n" for ln in read("fi-info-libfabric1-p4d.txt").splitlines())
    assert fi_info.parse(tagged, "n", NOW, expect=4).status == "pass"
    assert detect(tagged) == "fi-info"
    stamped = "".join(f"2026-11-22T10:00:0{i % 10}.123456789Z {ln}\n"
                      for i, ln in enumerate(read("nvidia-smi-q-h100-faulty.txt").splitlines()))
    r = nvidia_smi.parse(stamped, "n", NOW, expect_gpus=3)
    assert ("row_remap", 0, "REMAP_PENDING") in bad(r) and detect(stamped) == "nvidia-smi"


# -- nvidia-smi CSV queries -------------------------------------------------------------------

def test_csv_behind_ansible_oneline_prefix_with_units_is_read() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-ansible-oneline.txt"), "n", NOW, expect_gpus=2)
    assert r.source == "nvidia-smi"
    assert bad(r) == {("ecc.volatile_uncorrected", 1, "DBE"), ("row_remap", 1, "REMAP_PENDING")}
    assert {(m.name, m.gpu): m.value for m in r.metrics}[("gpu.power", 0)] == 69.85


def test_csv_after_a_prompt_with_na_cells_and_an_elision() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-prompt-na.txt"), "n", NOW)
    assert bad(r) == {("pcie.link", 2, "PCIE_DOWNTRAINED")}
    assert [c.status for c in r.checks if c.gpu == 1 and c.name != "pcie.link"] == ["skip", "skip"], \
        "[N/A] and [Not Supported] are not zero"
    assert not any("truncated" in c.message or "fields" in c.message for c in r.checks), "an elision is not a cut"


def test_retired_pages_query_rows_of_na_are_no_page() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-retired-pages-none.txt"), "n", NOW)
    assert r.status == "pass" and [m.value for m in r.metrics if m.name == "retired_pages"] == [0, 0]


def test_retired_pages_query_counts_pages_per_gpu() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-retired-pages-full.txt"), "n", NOW)
    assert r.status == "fail" and bad(r) == {("retired_pages", 0, "RETIRED_PAGES")}
    assert "00000000:3B:00.0: 61 retired pages" in next(c.message for c in r.checks if c.status == "fail")


def test_remapped_rows_query_failure() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-remapped-rows.txt"), "n", NOW)
    assert bad(r) == {("row_remap", 1, "REMAP_FAILURE")}


def test_compute_apps_says_nothing_about_health() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-compute-apps.txt"), "n", NOW)
    assert r.status == "skip" and r.metrics[0].value == 2


def test_a_cut_last_row_is_an_error_beside_the_rows_before_it() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-csv-cut-last-row.txt"), "n", NOW)
    assert r.status == "fail" and bad(r) == {("row_remap", 1, "REMAP_PENDING")}
    assert any(c.status == "error" and "last row" in c.message for c in r.checks)


# -- nvidia-smi -q, whole or one section -----------------------------------------------------

def test_a_bare_ecc_section_with_sram_uncorrectables_fails_an_unnamed_gpu() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-q-ecc-bare-sram.txt"), "n", NOW)
    assert bad(r) == {("ecc.volatile_uncorrected", 0, "DBE")}
    assert {(m.name, m.gpu): m.value for m in r.metrics}[("ecc.aggregate_uncorrected", 0)] == 2, \
        "the per-unit SRAM sources are not counted twice"
    assert [c.status for c in r.checks if c.name == "row_remap"] == ["skip"], "absent, so skip"


def test_a_temperature_section_per_gpu_judges_the_margin() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-q-temperature-two-gpus.txt"), "n", NOW, expect_gpus=2)
    assert bad(r) == {("thermal.margin", 1, "THERMAL")}


def test_fields_read_as_unknown_error_mean_the_gpu_does_not_answer() -> None:
    r = nvidia_smi.parse(read("nvidia-smi-q-fallen-off.txt"), "n", NOW)
    assert bad(r) == {("gpu.unreadable", 0, "GPU_UNREADABLE")}


def test_unable_to_determine_the_device_handle_fails_beside_the_gpus_still_read() -> None:
    text = ("Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error\n"
            + read("nvidia-smi-q-temperature-two-gpus.txt").replace("Attached GPUs                             : 2",
                                                                    "Attached GPUs                             : 3"))
    r = nvidia_smi.parse(text, "n", NOW, expect_gpus=3)
    assert ("gpu.lost", None, "GPU_LOST") in bad(r) and ("thermal.margin", 1, "THERMAL") in bad(r)


# -- ibv_devinfo --------------------------------------------------------------------------

def test_grep_filtered_state_lines_belong_to_the_hca_above() -> None:
    devs = ibv_devinfo.devices(read("ibv-devinfo-grep-state.txt"))
    assert devs is not None and [(d.name, [(p.state, p.phys_state) for p in d.ports]) for d in devs] == [
        ("mlx5_0", [("PORT_ACTIVE", "LINK_UP")]), ("mlx5_1", [("PORT_DOWN", "LINK_UP")]),
        ("mlx5_2", [("PORT_DOWN", "DISABLED")])]


def test_port_down_with_the_link_up_is_a_port_down_not_a_pass() -> None:
    r = ibv_devinfo.parse(read("ibv-devinfo-grep-state.txt"), "n", NOW, expect=3)
    down = [c.message for c in r.checks if c.code == "NIC_PORT_DOWN"]
    assert r.status == "fail" and len(down) == 2 and "no subnet manager" in down[0]


# -- auto-detection names what it chose ----------------------------------------------------

@pytest.mark.parametrize("fixture,fmt", [
    ("nvidia-smi-csv-ansible-oneline.txt", "nvidia-smi"), ("nvidia-smi-csv-prompt-na.txt", "nvidia-smi"),
    ("nvidia-smi-csv-retired-pages-none.txt", "nvidia-smi"), ("nvidia-smi-csv-remapped-rows.txt", "nvidia-smi"),
    ("nvidia-smi-csv-compute-apps.txt", "nvidia-smi"), ("nvidia-smi-q-ecc-bare-sram.txt", "nvidia-smi"),
    ("nvidia-smi-q-fallen-off.txt", "nvidia-smi"), ("ibv-devinfo-grep-state.txt", "ibv-devinfo"),
    ("fi-info-none.txt", "fi-info"), ("topo-merged-tabs.txt", "topo"),
])
def test_auto_detection_recognises_each_shape_and_the_result_names_it(fixture: str, fmt: str) -> None:
    text = read(fixture)
    assert detect(text) == fmt
    found, result = ingest(text, "n", "auto", now=NOW)
    assert found == fmt and result.source == fmt


# -- what is not this reader's format ------------------------------------------------------

READERS = {
    "nvidia-smi": lambda t: nvidia_smi.parse(t, "n", NOW, expect_gpus=8),
    "ibv-devinfo": lambda t: ibv_devinfo.parse(t, "n", NOW, expect=8, kind="ib"),
    "fi-info": lambda t: fi_info.parse(t, "n", NOW, expect=4),
    "topo": lambda t: topo.parse(t, "n", NOW, nvlinks=18, nic_affinity="PXB"),
}
OTHERS = {
    "one-huge-line": "GPU0 " + "NV18 " * 400_000,
    "json": json.dumps({"DCGM GPU Diagnostic": {"test_categories": []}}),
    "nccl-table": read("nccl-allreduce-h100.txt"),
    "dcgm-json": read("dcgm-4x-l2-pass.json"),
    "kernel-log": read("dmesg-xid79.txt"),
    "nvidia-smi": read("nvidia-smi-q-h100-healthy.txt"),
    "ibv-devinfo": read("ibv-devinfo-efa.txt"),
    "fi-info": read("fi-info-libfabric2-p5en.txt"),
    "topo": read("topo-p5-h100.txt"),
    "nul-bytes": "\x00" * 5000,
    "prompt-only": "$ nvidia-smi -q\n",
}


@pytest.mark.parametrize("reader,other", [(r, o) for r in sorted(READERS) for o in sorted(OTHERS) if o != r])
def test_another_tools_output_is_an_error_never_a_pass(reader: str, other: str) -> None:
    r = READERS[reader](OTHERS[other])
    assert r.status == "error", (reader, other, [(c.status, c.message) for c in r.checks])
    assert not any(c.status == "pass" for c in r.checks)


def test_dcgm_json_is_still_dcgm_to_auto_detection() -> None:
    assert detect(read("dcgm-4x-l2-pass.json")) == "dcgm"
    assert dcgm.parse(read("dcgm-4x-l2-pass.json"), "n", NOW, exit_code=0).status == "pass"
