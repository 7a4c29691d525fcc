from pathlib import Path

from sweeper.parsers.kernel_log import normalise_pci, parse_xids

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
