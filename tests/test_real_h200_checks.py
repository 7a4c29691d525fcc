"""What a real NVIDIA H200 said (one SXM module passed through to a Firecracker VM, driver
580.159.04, 2026-11-26), idle and 25 s into 40 s of bf16 matmuls: NVML as `python -m
sweeper.checks.probe` recorded it (tests/data/nvml-h200-580*.json, replayed by
tests/nvml_replay.py), `sweeper check` as it ran there (tests/data/h200-580/check-*.json), and
nvidia-smi's own outputs of the same minutes (tests/data/h200-580/).

The facts these hold the checks to:
- An H200 sold as "141 GB" reports 143,771 MiB (140.4 GiB) of framebuffer: the profiles of H200
  instances (p5e, p5en, Azure ND H200 v5) say `gpu_memory_gb: 141`, and the real GPU must pass it.
- Under load a healthy H200 sits at its power cap (clock event reason 0x4, SW power cap, 693 W
  average of 700) with 32 C of thermal margin (nvidia-smi's `GPU T.Limit Temp` and NVML's margin
  temperature agreeing): neither may fail or warn the node.
- With no NVLink reachable, `nvlink.state` is a skip that says so, never a pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweeper.checks import run_node_checks
from sweeper.checks.options import CheckOptions
from sweeper.formats import read
from sweeper.parsers import nvidia_smi
from tests.nvml_replay import RecordedNvml

DATA = Path(__file__).parent / "data"
MORE = DATA / "h200-580"
ROOT = Path(__file__).parent.parent
NOW = 1_800_000_000.0
PROFILES = ("p5en.48xlarge.yaml", "p5e.48xlarge.yaml", "azure-nd-h200-v5.yaml")


def opts(profile: str = "p5en.48xlarge.yaml") -> CheckOptions:
    p = yaml.safe_load((ROOT / "profiles" / profile).read_text())
    return CheckOptions(node="h200", expect_gpus=1, gpu_model=p["gpu_model"], gpu_memory_gb=p["gpu_memory_gb"],
                        skip_kernel_log="not recorded")


def replay(record: str, o: CheckOptions | None = None):
    return run_node_checks(o or opts(), RecordedNvml(json.loads((DATA / record).read_text())), None,
                           now=0.0, uptime=3600.0)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("record", ["nvml-h200-580.json", "nvml-h200-580-under-load.json"])
def test_a_healthy_h200_passes_every_h200_profile_idle_and_under_load(record: str, profile: str) -> None:
    result = replay(record, opts(profile))
    status = {c.name: (c.status, c.message) for c in result.checks}
    assert result.status == "pass", [c for c in result.checks if c.status not in ("pass", "skip")]
    assert status["gpu.memory"] == ("pass", "140.4 GiB")
    assert status["clocks.events"][0] == "pass" and status["thermal.margin"][0] == "pass"
    assert status["nvlink.state"][0] == "skip" and "no NVLink" in status["nvlink.state"][1]


def test_under_load_the_power_cap_is_the_reason_and_the_margin_narrows() -> None:
    idle, load = replay("nvml-h200-580.json"), replay("nvml-h200-580-under-load.json")
    msg = {r: {c.name: c.message for c in x.checks} for r, x in (("idle", idle), ("load", load))}
    assert "(0x1)" in msg["idle"]["clocks.events"] and "(0x4)" in msg["load"]["clocks.events"]
    assert msg["idle"]["thermal.margin"] == "55 C of margin" and msg["load"]["thermal.margin"] == "32 C of margin"


@pytest.mark.parametrize(("doc", "record"), [("check-idle.json", "nvml-h200-580.json"),
                                             ("check-under-load.json", "nvml-h200-580-under-load.json")])
def test_the_check_run_on_the_h200_agrees_with_the_replay(doc: str, record: str) -> None:
    live = json.loads((MORE / doc).read_text())
    assert live["status"] == "pass"
    per_gpu = {c["name"]: c["status"] for c in live["checks"] if c.get("gpu") == 0}
    assert per_gpu and {c.name: c.status for c in replay(record).checks if c.gpu == 0} == per_gpu


def test_a_replayed_h200_with_memory_missing_fails_the_profile() -> None:
    """The replay is no rubber stamp: the same record with a tenth of its memory gone fails."""
    record = json.loads((DATA / "nvml-h200-580.json").read_text())
    info = record["gpus"][0]["memory"]
    info["ok"]["total"] = int(info["ok"]["total"] * 0.85)
    result = run_node_checks(opts(), RecordedNvml(record), None, now=0.0, uptime=3600.0)
    assert {c.name: c.status for c in result.checks}["gpu.memory"] == "fail"


def test_nvidia_smis_own_outputs_of_the_same_gpu_pass() -> None:
    text = (MORE / "nvidia-smi-q-h200.txt").read_text()
    xml = (MORE / "nvidia-smi-q-x-h200.xml").read_text()
    a = nvidia_smi.parse(text, "n", NOW, expect_gpus=1)
    b = nvidia_smi.parse(xml, "n", NOW, expect_gpus=1)
    assert a.status == b.status == "pass", [c for c in a.checks + b.checks if c.status not in ("pass", "skip")]
    assert [(c.name, c.status, c.message) for c in a.checks] == [(c.name, c.status, c.message) for c in b.checks]
    csv = nvidia_smi.parse((MORE / "nvidia-smi-csv-h200-query-gpu.txt").read_text(), "n", NOW, expect_gpus=1)
    assert csv.status == "pass" and ("pcie.link", "pass") in {(c.name, c.status) for c in csv.checks}
    load = nvidia_smi.parse((MORE / "nvidia-smi-q-d-h200-under-load.txt").read_text(), "n", NOW,
                            thermal_margin_min=5.0)
    assert load.status == "pass"


def test_the_topology_of_a_gpu_alone_reads() -> None:
    fmt, r = read((MORE / "nvidia-smi-topo-h200.txt").read_text(), "n", "auto", NOW)
    assert fmt == "topo" and r.status != "error", [c for c in r.checks]
