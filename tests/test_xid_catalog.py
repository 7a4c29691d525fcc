"""NVIDIA's XID catalogue, whole, and what each of its buckets makes Sweeper do.

Every fact here is from NVIDIA's Xid Catalog,
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (its "Xids" sheet for the rows,
its "Fault Resolution Buckets" sheet for what each bucket means). tests/data/xid-catalog-published.psv
holds the published rows, one a line, in the page's own cell order.
"""

from pathlib import Path

import pytest

from sweeper.ingest import kernel_log
from sweeper.policy import BUILT_IN, judge_findings, load_policy
from sweeper.remedy import resettable
from sweeper.xid import (
    BUCKET_ACTIONS,
    CATALOG_URL,
    catalog_document,
    default_catalogue,
    judge_kernel_log,
    lookup,
)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = load_policy(ROOT / "policies" / "default.yaml")
GPUS = ("A100", "H100", "B100", "GB200")


def published() -> dict[int, list[str]]:
    rows = [line.rstrip("\n").split("|") for line in (ROOT / "tests/data/xid-catalog-published.psv").open()
            if not line.startswith("#")]
    return {int(r[0]): r[1:] for r in rows}


def line(code: int, text: str = "simulated fault", pci: str = "0000:5d:00") -> str:
    return f"[ 1000.000000] NVRM: Xid (PCI:{pci}): {code}, pid=4242, name=python3, {text}"


def verdict_of(log: str, policy_findings: object = SHIPPED.findings) -> str:
    result = kernel_log(log, "n1", 0.0)
    return judge_findings([result.to_dict()], policy_findings).verdict  # type: ignore[arg-type]


# -- the data is the catalogue ------------------------------------------------------------------

def test_the_data_holds_every_published_row_exactly() -> None:
    rows = published()
    doc = catalog_document()
    assert sorted(rows) == list(range(1, 173)), "the catalogue numbers its codes 1 to 172, none missing"
    assert sorted(doc["codes"]) == sorted(rows)
    for code, (mnemonic, description, *yes, immediate, investigatory, linkage) in rows.items():
        row = doc["codes"][code]
        assert (row["mnemonic"], row["description"], row["immediate"], row["investigatory"]) == \
               (mnemonic, description, immediate, investigatory), code
        assert row["applies_to"] == [g for g, y in zip(GPUS, yes, strict=True) if y == "YES"], code
        assert row.get("xid154_linkage", "") == linkage, code
        info = lookup(code)
        assert (info.mnemonic, info.immediate, info.investigatory, info.applies_to) == \
               (mnemonic, immediate, investigatory, tuple(row["applies_to"]))
    assert doc["source"] == CATALOG_URL and doc["read"] and "dated" in doc


@pytest.mark.parametrize(("code", "mnemonic", "applies", "immediate", "investigatory"), [
    (8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", GPUS, "RESTART_APP", "CONTACT_SUPPORT"),
    (13, "ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", GPUS, "RESTART_APP", "WORKFLOW_XID_13"),
    (1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", (), "CONTACT_SUPPORT", ""),
    (16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", (), "CONTACT_SUPPORT", "CONTACT_SUPPORT"),
    (32, "ROBUST_CHANNEL_PBDMA_ERROR", GPUS, "RESTART_APP", "CHECK_APP/CUDA"),
    (38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", GPUS, "IGNORE", "CONTACT_SUPPORT"),
    (45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", GPUS, "WORKFLOW_XID_45",
     "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)"),
    (48, "ROBUST_CHANNEL_GPU_ECC_DBE", GPUS, "WORKFLOW_XID_48", "WORKFLOW_XID_48"),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", ("A100", "H100", "B100"), "CHECK_MECHANICALS", "CONTACT_SUPPORT"),
    (69, "ROBUST_CHANNEL_GR_CLASS_ERROR", GPUS, "RESTART_APP", "CHECK_APP/CUDA"),
    (74, "NVLINK_ERROR", ("A100", "H100"), "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
    (78, "VGPU_START_ERROR", GPUS, "UPDATE_SWFW", "UPDATE_SWFW"),
    (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", GPUS, "RESTART_BM", "CONTACT_SUPPORT"),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED", ("A100",), "IGNORE", "CONTACT_SUPPORT"),
    (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", GPUS, "RESET_GPU", "IGNORE (sympathetic)"),
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", GPUS, "IGNORE", "XID_137_FLOW"),
    (121, "C2C_ERROR", ("GB200",), "IGNORE", "CONTACT_SUPPORT"),
    (137, "NVLINK_PRIV_ERR", GPUS, "IGNORE", "XID_137_FLOW"),
    (142, "ROBUST_CHANNEL_NVENC3_ERROR", ("GB200",), "CONTACT_SUPPORT", ""),
    (149, "NVLINK_NETIR_ERROR", ("B100", "GB200"), "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR"),
    (151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", ("H100", "B100", "GB200"), "RESTART_VM", "CONTACT_SUPPORT"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", GPUS, "XID_154", "N/A Informational only regarding another Xid"),
    (159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", ("B100", "GB200"), "CHECK_UVM", "SYMPATHETIC_REPORT_SOLO"),
    (162, "PSHC_REENGAGED", ("B100", "GB200"), "", ""),
    (167, "PCIE_FATAL_TIMEOUT", ("H100", "B100", "GB200"), "", ""),
    (172, "UNCORRECTABLE_SRAM_ERROR", GPUS, "", ""),
])
def test_spot_rows_read_off_the_page(code: int, mnemonic: str, applies: tuple[str, ...], immediate: str,
                                     investigatory: str) -> None:
    info = lookup(code)
    assert (info.mnemonic, info.applies_to, info.immediate, info.investigatory) == \
           (mnemonic, applies, immediate, investigatory)


def test_n_a_unused_is_a_trigger_condition_never_a_bucket_or_a_linkage() -> None:
    """The spreadsheet (docs.nvidia.com/Xid-Catalog.xlsx) puts an "Unused" row's "N/A; Unused" in
    Trigger Conditions and leaves its Investigatory and Xid 154 linkage cells empty; row 16 alone of
    them names an Investigatory bucket (CONTACT_SUPPORT), row 108 (Unused, yet YES on every GPU) has
    XID_137_FLOW and no linkage. Tables generated from the spreadsheet agree: leptonai/gpud's
    components/accelerator/nvidia/xid/catalog_generated.go has an empty Investigatory for each."""
    codes = catalog_document()["codes"]
    for code, row in codes.items():
        assert "N/A; Unused" not in (row["immediate"], row["investigatory"], row.get("xid154_linkage", "")), code
    unused = [c for c, row in codes.items() if row["description"] == "Unused" and not row["applies_to"]]
    assert len(unused) == 61 and [c for c in unused if codes[c]["investigatory"]] == [16]
    assert {codes[c]["immediate"] for c in unused} == {"CONTACT_SUPPORT"}
    assert "xid154_linkage" not in codes[16] and "xid154_linkage" not in codes[108]


def test_bucket_counts_of_the_catalogue() -> None:
    """Counted on the page: 48 codes RESTART_APP, 21 IGNORE, 14 RESET_GPU, 62 CONTACT_SUPPORT, 11 with no
    bucket (162-172)."""
    counts: dict[str, int] = {}
    for info in default_catalogue().values():
        counts[info.immediate] = counts.get(info.immediate, 0) + 1
    assert (counts["RESTART_APP"], counts["IGNORE"], counts["RESET_GPU"], counts[""]) == (48, 21, 14, 11)
    assert counts["CONTACT_SUPPORT"] == 62
    assert counts["RESTART_BM"] == counts["RESTART_VM"] == counts["CHECK_MECHANICALS"] == 1
    assert set(counts) <= set(BUCKET_ACTIONS)


# -- every code through `sweeper ingest` gets its bucket's verdict ------------------------------

# Bucket -> the verdict of the shipped policy for one XID of that bucket alone in a kernel log.
# IGNORE and RESTART_APP never hold a node; RESET_GPU is the reset path (a `reboot` verdict whose
# cause a GPU reset clears); RESTART_BM and RESTART_VM reboot; CHECK_MECHANICALS, UPDATE_SWFW and
# CONTACT_SUPPORT hold for a person; a code with no bucket warns.
EXPECTED = {"IGNORE": "warn", "RESTART_APP": "warn", "RESET_GPU": "reboot", "RESTART_BM": "reboot",
            "RESTART_VM": "reboot", "CHECK_MECHANICALS": "quarantine", "UPDATE_SWFW": "quarantine",
            "CONTACT_SUPPORT": "quarantine", "CHECK_UVM": "warn", "WORKFLOW_XID_45": "warn",
            "WORKFLOW_XID_48": "reboot", "WORKFLOW_NVLINK_ERR": "reboot", "WORKFLOW_NVLINK5_ERR": "reboot",
            "": "warn"}


@pytest.mark.parametrize("code", sorted(published()))
def test_every_catalogue_code_through_ingest_gets_its_buckets_verdict(code: int) -> None:
    immediate = published()[code][6]
    if immediate == "XID_154":
        return  # its text decides: test_xid_154_follows_its_text
    text = "NVLink: fatal error detected on link 6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)" if code == 74 else \
        "Fatal error on link 3" if immediate == "WORKFLOW_NVLINK5_ERR" else "simulated fault"
    log = line(code, text)
    for findings in (SHIPPED.findings, BUILT_IN.findings):
        assert verdict_of(log, findings) == EXPECTED[immediate], (code, immediate)
    reset = {"RESET_GPU", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR"}
    assert resettable([f"xid|{code}"]) is (immediate in reset), code


def test_application_and_informational_codes_never_hold_and_are_counted_per_gpu() -> None:
    """XIDs 8, 32, 38, 69, 121, 137: RESTART_APP or IGNORE in the catalogue; a warning with a per-GPU
    count (xid.<code>) that a trend rule may escalate when it repeats."""
    for code in (8, 32, 38, 69, 121, 137):
        checks, metrics = judge_kernel_log(line(code), {"0000:5d:00": 3})
        assert [(c.status, c.gpu) for c in checks] == [("warn", 3)], code
        assert [(m.name, m.gpu) for m in metrics] == [(f"xid.{code}", 3)]
        assert lookup(code).action in ("ignore", "restart_app")


def test_a_code_the_catalogue_lacks_warns_and_never_resets() -> None:
    checks, _ = judge_kernel_log(line(199))
    assert [c.status for c in checks] == ["warn"] and "unknown XID 199" in checks[0].message
    assert verdict_of(line(199)) == "warn" and not resettable(["xid|199"])


# -- XID 154 follows its text -------------------------------------------------------------------

@pytest.mark.parametrize(("said", "verdict", "resets"), [
    ("GPU Reset Required", "reboot", True), ("Node Reboot Required", "reboot", False),
    ("Drain and Reset", "reboot", True), ("Drain P2P", "warn", False), ("None", "pass", False)])
def test_xid_154_follows_its_text(said: str, verdict: str, resets: bool) -> None:
    """Row 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", the
    values None, Drain P2P, Drain and Reset, GPU Reset Required, Node Reboot Required."""
    log = line(154, f"GPU recovery action changed from 0x0 (None) to 0x1 ({said})")
    for findings in (SHIPPED.findings, BUILT_IN.findings):
        assert verdict_of(log, findings) == verdict, said
    checks, _ = judge_kernel_log(log)
    cause = f"xid|{checks[0].code}"
    assert (verdict == "reboot" and resettable([cause])) is resets


# -- the workflows --------------------------------------------------------------------------------

def test_xid_45_follows_the_other_xid_and_alone_restarts_fabric_manager() -> None:
    """WORKFLOW_XID_45: "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)"."""
    with_79 = line(45, "Ch 00000008") + "\n" + line(79, "GPU has fallen off the bus.", "0000:5e:00")
    checks, _ = judge_kernel_log(with_79)
    assert {(c.code, c.status) for c in checks} == {("45", "warn"), ("79", "fail")}
    assert "follow XID 79" in next(c.message for c in checks if c.code == "45")
    assert verdict_of(with_79) == "reboot"
    assert verdict_of(line(45)) == "warn"


def test_xid_48_resets_the_gpu() -> None:
    """WORKFLOW_XID_48: "Data Center Recovery Action Solo: RESET_GPU w/ 63 or 64: DRAIN_AND_RESET";
    the row: "A GPU reset or node reboot is needed to clear this error"."""
    assert verdict_of(line(48, "An uncorrectable double bit error (DBE) has been detected on GPU")) == "reboot"
    assert resettable(["xid|48"]) and not resettable(["xid|79"])


@pytest.mark.parametrize(("fields", "status"), [
    ("0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "fail"),      # first register bit 16: possibly HW
    ("0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "warn"),          # bit 0: "can be safely ignored"
    ("0x40800001, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", "warn"),   # bits 0, 23, 30: all ignorable
    ("0x0, 0x0, 0x0, 0x0, 0x100000, 0x0, 0x0", "warn"),     # fifth register bit 20: ECC threshold, continue
    ("0x0, 0x0, 0x0, 0x0, 0x40000, 0x0, 0x0", "fail"),      # fifth register bit 18: ECC/parity
    ("0x0, 0x0, 0x40000, 0x0, 0x0, 0x0, 0x0", "fail"),      # fourth register bit 18: fabric reset
    ("0x0, 0xffffffff, 0x0, 0x0, 0x0, 0x0, 0x0", "warn"),   # the second register is not valid on Hopper
])
def test_xid_74_is_decoded_by_nvidias_workflow(fields: str, status: str) -> None:
    """WORKFLOW_NVLINK_ERR: seven fields; the first, third, fourth and fifth are valid on Hopper. The
    line's shape: "NVLink: fatal error detected on link 6(0x10000, 0x0, ...)" (AWS's SageMaker
    HyperPod docs quote it)."""
    checks, _ = judge_kernel_log(line(74, f"NVLink: fatal error detected on link 6({fields})"))
    assert [c.status for c in checks] == [status]


def test_xid_144_to_150_fatal_resets_and_nonfatal_warns() -> None:
    """Where the decode sheet does not say, the line's own word decides: its Non-fatal rows are
    IGNORE or XID_154_EVAL (RESTART_APP without an XID 154), its Fatal rows RESET_GPU."""
    for code in range(144, 151):
        assert verdict_of(line(code, "FOO_UNIT Fatal XC0 i0 Link 05 (0x00440002 0x00000001 0x0)")) == "reboot"
        assert verdict_of(line(code, "FOO_UNIT Nonfatal XC1 i0 Link 05 (0x00000004 0x00000001 0x0)")) == "warn"


# Lines as the R570-R580 drivers print them (leptonai/gpud's XID tests quote these), and the bucket the
# catalogue's "XID 144-150 Decode" sheet gives their sub-component and Error Status (second field).
@pytest.mark.parametrize(("code", "text", "status"), [
    (144, "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000)", "warn"),   # IGNORE
    (144, "SAW_MVB Fatal XC0 i0 Link 0 (0x00000001 0x00000010 0x00000000 0x00000000)", "fail"),      # RESET_GPU
    (145, "RLW_CTRL Nonfatal XC0 i0 Link 00 (0x00000003 0x80000000 0x00000000 0x00000000)", "warn"),
    (145, "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)", "warn"),  # 154_EVAL
    (145, "RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000080 0x00000000 0x00000000)", "fail"),
    (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 11 (0x00000006 0x00000002 0x0 0x0)", "warn"),     # IGNORE
    (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 11 (0x00000086 0x00000002 0x0 0x0)", "fail"),     # action 2, R575+
    (145, "RLW_RXPIPE Nonfatal XC0 i0 Link 11 (0x000004c2 0x00000004 0x0 0x0)", "fail"),     # action 2, <R575
    (146, "TLW_RX_PIPE1 Nonfatal XC0 i0 Link 02 (0x0000000b 0x00000002 0x0 0x0)", "warn"),
    (146, "TLW_TX_PIPE0 Fatal XC0 i0 Link 02 (0x0000000c 0x00000004 0x0 0x0)", "fail"),
    (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000)", "fail"),  # peer
    (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000)", "warn"),  # SW/user
    (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 0x00000000 0x00000000)", "fail"),  # link SI
    (149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 08 (0x00000013 0x00000002 0x0 0x0)", "warn"),
    (149, "NETIR_MFDE_EVENT Fatal XC0 i0 Link 08 (0x00000014 0x00000004 0x0 0x0)", "fail"),
    (150, "MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)", "fail"),
])
def test_xid_144_to_150_are_decoded_by_nvidias_sheet(code: int, text: str, status: str) -> None:
    checks, _ = judge_kernel_log(line(code, text))
    assert [c.status for c in checks] == [status], checks[0].message
    assert verdict_of(line(code, text)) == ("reboot" if status == "fail" else "warn")
    assert resettable([f"xid|{code}"])


# -- the driver's own recovery action, read through NVML -----------------------------------------

@pytest.mark.parametrize(("action", "verdict", "resets"), [
    (0, "pass", False), (1, "reboot", True), (2, "reboot", False), (3, "warn", False), (4, "reboot", True),
    (None, "pass", False)])
def test_the_nvml_recovery_action_decides_where_the_driver_reports_it(action: int | None, verdict: str,
                                                                       resets: bool) -> None:
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (pynvml: NONE 0, GPU_RESET 1, NODE_REBOOT 2, DRAIN_P2P 3,
    DRAIN_AND_RESET 4), the reading XID 154 announces. A driver that does not report it (None) gives
    no finding that holds, never a failure; a swept node is drained, so drain-and-reset is a reset."""
    from sweeper.checks import run_node_checks
    from sweeper.checks.fake import FakeGpu, FakeNvml
    from sweeper.checks.options import CheckOptions

    gpus = [FakeGpu(index=i) for i in range(8)]
    gpus[4].recovery_action = action
    r = run_node_checks(CheckOptions(node="n1"), FakeNvml(gpus), "[    5.000000] nvidia: loading\n", now=0.0)
    doc = r.to_dict()
    assert judge_findings([doc], SHIPPED.findings).verdict == verdict
    found = [c for c in doc["checks"] if c["name"] == "gpu.recovery_action" and c["status"] == "fail"]
    assert resettable([f"{c['name']}|{c['code']}" for c in found]) is resets
    if action is None:
        assert [c["status"] for c in doc["checks"] if c["name"] == "gpu.recovery_action" and c.get("gpu") == 4] \
            == ["skip"]


def test_a_finding_says_the_driver_s_words_once_where_they_are_the_catalogue_s() -> None:
    """XID 79's line ends "GPU has fallen off the bus.", which is also the catalogue's description:
    the finding read "XID 79 (GPU has fallen off the bus) on 0000:5d:00: GPU has fallen off the bus"
    (issue 24, point 7). Words of the driver's own that the catalogue lacks are still kept."""
    same = "[ 50.0] NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    (check,), _ = judge_kernel_log(same)
    assert check.message.count("fallen off the bus") == 1, check.message
    other = "[ 50.0] NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, name=python, GPU has fallen off the bus; link 3\n"
    (check,), _ = judge_kernel_log(other)
    assert "link 3" in check.message, check.message
