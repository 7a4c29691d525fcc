"""The node checks run on what a real NVIDIA H100 80GB HBM3 said (driver 580.159.04, 2026-11-25):
idle, right after 20 s of bf16 matmuls, and 25 s into 45 s of them, as `python -m
sweeper.checks.probe` recorded it (tests/data/nvml-h100-580*.json), replayed by
tests/nvml_replay.py. A healthy GPU under load is capped by its own power management (clock event
reason 0x4, SW power cap, at 698 W of 700) and runs with 25 C of thermal margin: neither may fail
or warn the node, or a soak under load would quarantine healthy GPUs. The same day, `sweeper check`
itself run on that machine during the load printed pass for every check
(tests/data/h100-580/check-under-load.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeper.checks import run_node_checks
from sweeper.checks.options import CheckOptions
from tests.nvml_replay import RecordedNvml

DATA = Path(__file__).parent / "data"
OPTS = CheckOptions(node="h100", expect_gpus=1, gpu_model="H100", gpu_memory_gb=80, skip_kernel_log="not recorded")


@pytest.mark.parametrize("record", ["nvml-h100-580.json", "nvml-h100-580-after-load.json",
                                    "nvml-h100-580-under-load.json"])
def test_a_healthy_h100_passes_idle_and_under_load(record: str) -> None:
    result = run_node_checks(OPTS, RecordedNvml(json.loads((DATA / record).read_text())), None, now=0.0, uptime=3600.0)
    status = {c.name: c.status for c in result.checks}
    assert result.status == "pass", [c for c in result.checks if c.status not in ("pass", "skip")]
    assert status["clocks.events"] == "pass" and status["thermal.margin"] == "pass"
    assert status["row_remap"] == "pass" and status["gpu.recovery_action"] == "pass"
    assert status["nvlink.state"] == "skip", "the VM reached no NVLink: a skip saying so, never a pass"


def test_the_recorded_check_under_load_agrees_with_the_replay() -> None:
    doc = json.loads((DATA / "h100-580" / "check-under-load.json").read_text())
    replay = run_node_checks(OPTS, RecordedNvml(json.loads((DATA / "nvml-h100-580-under-load.json").read_text())),
                             None, now=0.0, uptime=3600.0)
    live = {c["name"]: c["status"] for c in doc["checks"] if c.get("gpu") == 0}
    assert live and {c.name: c.status for c in replay.checks if c.gpu == 0} == live


def test_a_replayed_gpu_under_its_thermal_floor_fails() -> None:
    """The replay is no rubber stamp: the under-load record with 3 C of margin left against a
    profile floor of 5 C fails THERMAL."""
    record = json.loads((DATA / "nvml-h100-580-under-load.json").read_text())
    record["gpus"][0]["margin_temperature"] = {"ok": 3}
    opts = CheckOptions(**{**OPTS.__dict__, "thermal_margin_min": 5.0})
    result = run_node_checks(opts, RecordedNvml(record), None, now=0.0, uptime=3600.0)
    assert any(c.code == "THERMAL" and c.status == "fail" for c in result.checks)
