"""The fake NVML held to a real one. `tests/data/nvml-h100-580*.json` are what `python -m
sweeper.checks.probe` recorded on a real NVIDIA H100 80GB HBM3 (SXM module passed through to a VM,
driver 580.159.04, CUDA 13.0, 2026-11-25), idle and right after 20 s of bf16 matmuls. The same
probe is run against the fake built for a healthy H100, and every reading must come back the same
way: ok, or the same NVMLError class; and an ok value of the same type and shape. Values that
depend on the machine (bus id, serial, UUID, temperature, power, timestamps) are held to their type
and a plausible range; the rest must be equal.

What the real GPU taught the fake (each was wrong before): nvmlDeviceGetRetiredPagesPendingStatus
answers NotSupported on a GPU that remaps rows, as nvmlDeviceGetRetiredPages does; PCI and memory
info are the bindings' ctypes structures (nvmlPciInfo_t with bytes, c_nvmlMemory_t with free + used
= total), not bare objects; field 230 (the recovery action) comes back as c_nvmlFieldValue_t with
nvmlReturn 0, valueType 1 (unsigned int) and the c_nvmlValue_t union; nvmlDeviceGetGpuFabricInfo
answers success with state 0 on a Hopper GPU that has no NVSwitch fabric; and the system calls the
probe makes (NVML version, CUDA driver version, VBIOS, serial, board part number) exist.

The recorded recovery action value: the probe of that day printed the union as a repr (it checked
for ctypes.Structure only). The fixture records `{"uiVal": 0}`, derived rather than re-captured:
valueType 1 names uiVal, and `nvidia-smi -q` on the same GPU in the same minute printed
`GPU Recovery Action : None`, which is 0 (nvmlDeviceGpuRecoveryAction_t).

One difference is kept on purpose: this VM reached no NVLink (link 0 answered NotSupported), so the
fake here is built with `nvlinks=0`; an SXM H100 in a real 8-GPU HGX node has 18 NVLinks and joins
an NVSwitch fabric, and the simulator's profiles keep that (`FakeGpu`'s default of 18 links,
fabric state 3), which the last test pins.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from sweeper.checks.fake import FakeGpu, FakeNvml
from sweeper.checks.probe import probe

DATA = Path(__file__).parent / "data"
RECORDS = ("nvml-h100-580.json", "nvml-h100-580-after-load.json")


def _between(lo: float, hi: float) -> Callable[[Any], bool]:
    return lambda v: lo <= v <= hi


# Readings whose value depends on the machine or the moment: held to a plausible range or shape.
PLAUSIBLE: dict[str, Callable[[Any], bool]] = {
    "temperature": _between(10, 100), "margin_temperature": _between(-20, 90),
    "power": _between(20_000, 800_000), "clock_events": lambda v: v & ~0x7 == 0,  # idle, app clocks, SW power cap
    "pcie_gen": _between(1, 5), "serial": re.compile(r"^\d{13}$").match,
    "uuid": re.compile(r"^GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$").match,
    "vbios": re.compile(r"^[0-9A-F]{2}(\.[0-9A-F]{2}){4}$").match,
    "busId": re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$").match,
    "busIdLegacy": re.compile(r"^[0-9A-F]{4}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$").match,
    "bus": _between(0, 255), "device": _between(0, 31), "domain": _between(0, 0xFFFF),
    "timestamp": lambda v: v >= 0, "latencyUsec": _between(0, 10_000),
}
# Lists whose length is the bindings' and not the GPU's: clusterUuid is 16 bytes in nvidia-ml-py
# 13.615 and was printed as 80 by the bindings on the GPU machine.
ANY_LENGTH = {"clusterUuid"}


def healthy_h100_as_captured() -> FakeNvml:
    return FakeNvml([FakeGpu(index=0, bus_id="00000000:00:06.0", nvlinks=0, fabric_state=0)],
                    driver="580.159.04", cuda=13000)


def same_shape(real: Any, fake: Any, path: str, problems: list[str]) -> None:
    key = path.rsplit(".", 1)[-1]
    if type(real) is not type(fake):
        problems.append(f"{path}: real {type(real).__name__} {real!r:.60}, fake {type(fake).__name__} {fake!r:.60}")
        return
    if isinstance(real, dict):
        union = key == "value"  # c_nvmlValue_t: the fixture holds the member its valueType names
        missing = set(real) - set(fake)
        extra = set() if union else set(fake) - set(real)
        if missing or extra:
            problems.append(f"{path}: keys missing from the fake {sorted(missing)}, only in the fake {sorted(extra)}")
        for k in sorted(set(real) & set(fake)):
            same_shape(real[k], fake[k], f"{path}.{k}", problems)
    elif isinstance(real, list):
        if len(real) != len(fake) and key not in ANY_LENGTH:
            problems.append(f"{path}: {len(real)} items, the fake {len(fake)}")
        for n, (r, f) in enumerate(zip(real, fake, strict=False)):
            same_shape(r, f, f"{path}[{n}]", problems)
    elif key in PLAUSIBLE:
        for who, v in (("real", real), ("fake", fake)):
            if not PLAUSIBLE[key](v):
                problems.append(f"{path}: the {who} value {v!r} is not plausible")
    elif real != fake:
        problems.append(f"{path}: real {real!r}, fake {fake!r}")


def compare(real: dict[str, Any], fake: dict[str, Any], path: str, problems: list[str]) -> None:
    """Each reading ({"ok": value} or {"error": class}) of the real record against the fake's."""
    for name, got in real.items():
        if name in ("bindings", "_note"):
            continue
        where = f"{path}.{name}" if path else name
        mine = fake.get(name)
        if mine is None:
            problems.append(f"{where}: the fake's probe has no such reading")
        elif name == "gpus":
            for n, (r, f) in enumerate(zip(got, mine, strict=True)):
                compare(r, f, f"gpus[{n}]", problems)
        elif name == "nvlink":
            for r, f in zip(got, mine, strict=True):
                compare({k: v for k, v in r.items() if k != "link"}, f, f"{where}[{r['link']}]", problems)
        elif "error" in got or "error" in mine:
            if got.get("error") != mine.get("error"):
                problems.append(f"{where}: real {got.get('error') or 'ok'}, fake {mine.get('error') or 'ok'}")
        else:
            same_shape(got.get("ok"), mine.get("ok"), where, problems)
            if "info" in got:
                same_shape(got["info"], mine.get("info"), f"{where}.info", problems)


@pytest.mark.parametrize("record", RECORDS)
def test_the_fake_answers_every_probe_reading_as_the_real_h100_did(record: str) -> None:
    real = json.loads((DATA / record).read_text())
    fake = json.loads(json.dumps(probe(healthy_h100_as_captured())))
    problems: list[str] = []
    compare(real, fake, "", problems)
    assert not problems, "\n".join(problems)


def test_the_comparison_catches_a_fake_that_disagrees() -> None:
    """The same comparison finds a pending-status reading that answers where the real one refused,
    a bare object where the bindings return a structure, and a wrong field value type."""
    real = json.loads((DATA / RECORDS[0]).read_text())
    fake = json.loads(json.dumps(probe(healthy_h100_as_captured())))
    gpu = fake["gpus"][0]
    gpu["retired_pages_pending"] = {"ok": 0}
    gpu["pci"] = {"ok": "namespace(busId='00000000:00:06.0')"}
    gpu["field_recovery_action"]["ok"][0]["valueType"] = 0
    problems: list[str] = []
    compare(real, fake, "", problems)
    assert len(problems) == 3, problems


def test_the_probe_prints_a_field_value_union_by_its_members() -> None:
    """c_nvmlValue_t is a ctypes.Union: the probe prints its members, not a repr; valueType 1 names
    uiVal, where the driver's recovery action (0: none) is."""
    nvml = healthy_h100_as_captured()
    nvml.gpus[0].recovery_action = 2
    (field,) = probe(nvml)["gpus"][0]["field_recovery_action"]["ok"]
    assert field["valueType"] == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT == 1
    assert isinstance(field["value"], dict) and field["value"]["uiVal"] == 2
    assert set(field["value"]) == {name for name, _ in pynvml.c_nvmlValue_t._fields_}


def test_the_probe_still_runs_as_a_module_where_there_is_no_gpu() -> None:
    """`python -m sweeper.checks.probe` on a machine without NVIDIA's library records that, exit 0."""
    proc = subprocess.run([sys.executable, "-m", "sweeper.checks.probe"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert "init" in record and ("error" in record["init"] or "gpus" in record)


def test_the_simulators_hgx_h100_keeps_its_nvlinks_and_fabric() -> None:
    """Unlike the VM above, an H100 SXM in an 8-GPU HGX node answers for 18 links and a fabric."""
    gpu = FakeGpu(index=0, fabric_state=3)
    record = probe(FakeNvml([gpu]))["gpus"][0]
    assert len(record["nvlink"]) == 18 and record["nvlink"][0]["state"] == {"ok": pynvml.NVML_FEATURE_ENABLED}
    assert record["fabric"]["info"]["state"] == 3
