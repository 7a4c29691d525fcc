from pathlib import Path

from sweeper.checks import run_node_checks
from sweeper.checks.fake import FakeNvml
from sweeper.checks.options import CheckOptions
from sweeper.ingest import kernel_log
from sweeper.parsers.kernel_log import normalise_pci, parse_xids
from sweeper.xid import judge_kernel_log

FIXTURES = Path(__file__).parent / "fixtures"


def test_xid_lines_are_parsed_and_deduplicated() -> None:
    events = parse_xids((FIXTURES / "dmesg-xid79.txt").read_text())
    assert [(e.code, e.pci, e.switch) for e in events] == [
        (79, "0000:5d:00", False), (13, "0000:18:00", False), (154, "0000:2a:00", False), (12028, "0000:05:00", True)]
    assert events[0].uptime == 8812.551301
    assert events[0].message.endswith("GPU has fallen off the bus.")


def test_xid_154_carries_the_drivers_verdict() -> None:
    events = parse_xids((FIXTURES / "dmesg-xid79.txt").read_text())
    assert events[2].recovery_action == "Node Reboot Required"


def test_pci_addresses_from_nvml_and_the_kernel_match() -> None:
    assert normalise_pci("00000000:5D:00.0") == normalise_pci("0000:5d:00") == "0000:5d:00"


def test_no_xids_in_unrelated_text() -> None:
    assert parse_xids("") == []
    assert parse_xids("random\nNVRM: nothing to see\nXid but not the driver's line") == []


# -- the judge that `sweeper check` and `sweeper ingest` share ------------------------------

# The 570 driver's own wording, split over indented lines (NVIDIA/NVSentinel#155).
LOST_DMESG = """[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
               NVRM: (PCI ID: 10de:26b5) installed in this system has
               NVRM: fallen off the bus and is not responding to commands.
[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).
"""
# The same message as the journal prints it, each piece behind its own header.
LOST_JOURNAL = """Feb 14 05:03:41 gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE
Feb 14 05:03:42 gpu-1 kernel: NVRM: The NVIDIA GPU 0000:3b:00.0
Feb 14 05:03:42 gpu-1 kernel: NVRM: (PCI ID: 10de:2330) installed in this system has
Feb 14 05:03:42 gpu-1 kernel: NVRM: fallen off the bus and is not responding to commands.
"""
INIT_FAILED = "[   21.091872] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:894)\n"


def test_a_gpu_lost_without_an_xid_fails_naming_its_address() -> None:
    for log, pci in ((LOST_DMESG, "0000:b3:00"), (LOST_JOURNAL, "0000:3b:00"), (INIT_FAILED, "0000:01:00")):
        checks, _ = judge_kernel_log(log)
        lost = [c for c in checks if c.name == "gpu.lost"]
        assert [c.status for c in lost] == ["fail"], checks
        assert pci in lost[0].message and lost[0].code == "GPU_LOST"


def test_an_xid_line_reports_its_own_code_and_its_cause_raises_the_verdict() -> None:
    """The 5xx drivers append "caused by previous Xid N" to a derived Xid 45 (open-gpu-kernel-modules,
    journal.c); NVIDIA/open-gpu-kernel-modules#1150 shows such lines after NVLink faults."""
    nvlink = "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149\n"
    checks, _ = judge_kernel_log(nvlink)
    assert [(c.code, c.status) for c in checks] == [("45", "warn")]
    assert "149" in checks[0].message
    alone, _ = judge_kernel_log(nvlink.replace(" caused by previous Xid 149", ""))
    # Solo, NVIDIA's XID 45 workflow restarts Fabric Manager: never a hold of its own (the catalogue's
    # WORKFLOW_XID_45 row, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
    assert [(c.code, c.status) for c in alone] == [("45", "warn")]
    assert "Fabric Manager" in alone[0].message
    fatal, _ = judge_kernel_log(nvlink.replace("Xid 149", "Xid 79"))
    assert [(c.code, c.status) for c in fatal] == [("45", "fail")]


def test_what_is_not_a_kernel_log_is_an_error_and_a_clean_one_passes() -> None:
    for text in ("", "\n\n", '{"DCGM Diagnostic": {"test_categories": []}}', "hello world\nno kernel here\n",
                 "x" * 200_000, "\x00\xff\x10garbage"):
        r = kernel_log(text, "n1", 0.0)
        assert r.status == "error", (text[:40], r.checks)
    clean = "[    5.000000] nvidia: loading out-of-tree module taints kernel.\n[    6.2] NVRM: loading NVIDIA UNIX\n"
    assert kernel_log(clean, "n1", 0.0).status == "pass"
    syslog = "May  7 06:45:12 errol kernel: [21584690.529862] mce: [Hardware Error]: Machine check events logged\n"
    assert kernel_log(syslog, "n1", 0.0).status == "pass"


def test_the_check_job_and_ingest_judge_a_log_alike() -> None:
    opts = CheckOptions(node="n1")
    checked = run_node_checks(opts, FakeNvml([]), LOST_DMESG, now=0.0)
    ingested = kernel_log(LOST_DMESG, "n1", 0.0)
    lost = [c for c in checked.checks if c.name == "gpu.lost"]
    assert lost and lost == [c for c in ingested.checks if c.name == "gpu.lost"]
    assert run_node_checks(opts, FakeNvml([]), "", now=0.0).checks[-1].status == "error"
