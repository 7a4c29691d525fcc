"""What a real H100 80GB HBM3 (SXM, passed through to a VM, driver 580.159.04, CUDA 13.0) printed,
read as it printed it. The samples are in `fixtures/real/` (source: captured on that GPU on
2026-11-25); each test below failed on the reader before it learnt the shape.

NVIDIA's words for the fields judged here:
- `GPU Recovery Action` (None, Reset, Reboot, Drain P2P, Drain and Reset): "Error Recovery and
  Response Flags", https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html,
  the values 0-4 of nvmlDeviceGpuRecoveryAction_t (cuda-python's DeviceGpuRecoveryAction,
  https://nvidia.github.io/cuda-python/cuda-bindings/latest/module/generated/cuda.bindings.nvml.DeviceGpuRecoveryAction.html);
- `Channel Repair Pending`, `TPC Repair Pending`: nvmlDeviceGetRepairStatus ("the repair status for
  TPC/Channel repair"), `Unrepairable Memory`: nvmlDeviceGetUnrepairableMemoryFlag_v1, both in the
  NVML API reference, https://docs.nvidia.com/deploy/nvml-api/group__nvmlAffinity.html;
- `GPU T.Limit Temp`: the degrees to the slowdown limit, what nvmlDeviceGetMarginTemperature returns
  (the same GPU printed 45 C there and NVML's margin read 45 in the same minute, probe.txt);
- `Retired Pages: N/A` and `--query-retired-pages` rows of `[N/A], <cause>`: page retirement is not
  reported on Ampere and later, where row remapping replaced it ("A100 GPU Memory Error Management",
  https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html); NVML's nvmlDeviceGetRetiredPages
  answered NotSupported on this GPU.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sweeper.checks import run_node_checks
from sweeper.checks.fake import FakeGpu, FakeNvml
from sweeper.checks.options import CheckOptions
from sweeper.formats import detect, read
from sweeper.ingest import ingest_stream
from sweeper.parsers import nvidia_smi, topo
from sweeper.parsers.paste import clean, strip_escapes

REAL = Path(__file__).parent / "fixtures" / "real"
MORE = Path(__file__).parent.parent / "data" / "h100-580"  # healthy readings the corpus has no room for
NOW = 1_800_000_000.0
Q = "nvidia-smi-q-h100-580-vm-healthy.txt"
QX = "nvidia-smi-q-x-h100-580-vm-healthy.txt"


def sample(name: str) -> str:
    return (REAL / name if (REAL / name).exists() else MORE / name).read_text()


def found(r) -> set[tuple[str, str, str | None]]:
    return {(c.name, c.status, c.code) for c in r.checks}


# -- 1. --query-retired-pages ---------------------------------------------------------------

def test_an_na_address_with_a_cause_is_not_a_retired_page() -> None:
    """`00000000:00:06.0, [N/A], Single Bit ECC` and `..., Double Bit ECC`: one row per cause and no
    page. Read as two retired pages before; now a skip that says the GPU does not report them."""
    r = nvidia_smi.parse(sample("nvidia-smi-csv-h100-580-retired-pages-na-causes.txt"), "n", NOW)
    assert r.status == "skip", found(r)
    (check,) = r.checks
    assert check.name == "retired_pages" and "does not report page retirement" in check.message
    assert not [m for m in r.metrics if m.name == "retired_pages"], "no count where no page was listed"


def test_real_addresses_beside_na_rows_are_still_counted() -> None:
    text = ("gpu_bus_id, retired_pages.address, retired_pages.cause\n"
            "00000000:00:06.0, [N/A], Single Bit ECC\n" + "".join(
                f"00000000:00:07.0, 0x{0x2f000 + 64 * k:08x}, Double Bit ECC\n" for k in range(61)))
    r = nvidia_smi.parse(text, "n", NOW)
    assert ("retired_pages", "fail", "RETIRED_PAGES") in found(r)
    assert ("retired_pages", "skip", None) in found(r)


# -- 2. terminal escapes --------------------------------------------------------------------

def test_topo_with_underline_escapes_is_detected_and_a_one_gpu_matrix_parses() -> None:
    """driver 580 wraps the header row of `nvidia-smi topo -m` in ESC[4m ... ESC[0m even into a file."""
    text = sample("topo-h100-one-gpu-580-underline-escapes.txt")
    assert "\x1b[4m" in text and "\x1b[0m" in text, "the sample keeps the bytes as captured"
    assert detect(text) == "topo"
    matrix = topo.parse_matrix(text)
    assert matrix is not None and matrix.gpus == ["GPU0"] and matrix.link("GPU0", "GPU0") == "X"
    fmt, r = read(text, "n", "topo", NOW)
    assert r.status == "pass" and r.checks[0].message.startswith("1 GPU")
    _, r = read(text, "n", "topo", NOW, nvlinks=18)
    assert found(r) == {("topology.gpu_gpu", "fail", "NVLINK_TOPOLOGY")}, "a profile expecting NVLink needs pairs"


def test_escapes_come_off_for_every_format_and_in_the_stream() -> None:
    """Colour from `dmesg --color=always` (SGR around the stamp and the facility) and an OSC title:
    the kernel-log reader sees the XID, whether the text is read whole or streamed."""
    line = "\x1b[32m[ 1234.5]\x1b[0m \x1b[33mNVRM: \x1b[0mXid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n"
    assert strip_escapes("\x1b]0;title\x07" + line).startswith("[ 1234.5] NVRM: Xid")
    _, r = read(line, "n", "auto", NOW)
    assert r.source == "kernel-log" and r.status == "fail"
    _, streamed = ingest_stream(io.BytesIO(line.encode()), "n", "kernel-log", NOW)
    assert streamed.status == "fail" and {c.code for c in streamed.failed_checks} == {r.failed_checks[0].code}
    assert clean("\x1b[1mindex, name\x1b[0m\n").lines[0] == "index, name"


def test_stripping_escapes_is_linear_on_hostile_input() -> None:
    """An ESC [ with thousands of parameter bytes and no final byte, or an OSC with no end: each
    part of the expression is bounded, so this is one pass, and the text around it survives."""
    nasty = ("\x1b[" + "1;" * 50_000) + "x\n" + "\x1b]" + "a" * 100_000 + "\nGPU0\n"
    out = strip_escapes(nasty)
    assert out.endswith("GPU0\n")


# -- 3. -q fields of driver 580 -------------------------------------------------------------

def test_the_real_q_output_reads_its_new_fields() -> None:
    r = nvidia_smi.parse(sample(Q), "n", NOW, expect_gpus=1)
    assert r.status == "pass"
    assert {("gpu.recovery_action", "pass", None), ("gpu.repair", "pass", None), ("retired_pages", "skip", None),
            ("thermal.margin", "pass", None)} <= found(r)
    assert [m.value for m in r.metrics if m.name == "gpu.thermal_margin"] == [45.0]


@pytest.mark.parametrize("words,status,code", [
    ("Reset", "fail", "RECOVERY_RESET"), ("Reboot", "fail", "RECOVERY_REBOOT"),
    ("Drain P2P", "warn", "RECOVERY_DRAIN_P2P"), ("Drain and Reset", "fail", "RECOVERY_RESET")])
def test_recovery_action_words_are_judged_as_nvml_judges_the_number(words: str, status: str, code: str) -> None:
    """The -q words and the NVML field value of the same action give the same check."""
    text = sample(Q).replace("GPU Recovery Action                                : None",
                             f"GPU Recovery Action                                : {words}")
    r = nvidia_smi.parse(text, "n", NOW)
    (got,) = [c for c in r.checks if c.name == "gpu.recovery_action"]
    assert (got.status, got.code) == (status, code)
    action = nvidia_smi.RECOVERY_WORDS[words.lower()]
    nvml = run_node_checks(CheckOptions(node="n", expect_gpus=1, expect_nvlinks=0), FakeNvml(
        [FakeGpu(index=0, recovery_action=action, nvlinks=0)]), "", now=NOW, uptime=3600)
    (same,) = [c for c in nvml.checks if c.name == "gpu.recovery_action"]
    assert (same.status, same.code, same.message) == (got.status, got.code, got.message)


@pytest.mark.parametrize("line,value", [
    ("GPU Recovery Action                                : None", "Sideways"),
    ("        Channel Repair Pending                         : No", "Maybe"),
    ("        Unrepairable Memory                            : No", "Perhaps"),
    ("            SRAM Threshold Exceeded                    : No", "Soon"),
    ("        GPU T.Limit Temp                               : 45 C", "hot"),
])
def test_an_unknown_value_of_a_verdict_field_is_an_error(line: str, value: str) -> None:
    key = line.split(":")[0]
    r = nvidia_smi.parse(sample(Q).replace(line, f"{key}: {value}"), "n", NOW)
    assert r.status == "error", found(r)
    assert any(c.status == "error" and value in c.message for c in r.checks)


@pytest.mark.parametrize("line,name,code", [
    ("        Channel Repair Pending                         : No", "gpu.repair", "REPAIR_PENDING"),
    ("        TPC Repair Pending                             : No", "gpu.repair", "REPAIR_PENDING"),
    ("        Unrepairable Memory                            : No", "gpu.unrepairable_memory", "UNREPAIRABLE_MEMORY"),
    ("            SRAM Threshold Exceeded                    : No", "ecc.sram_threshold", "SRAM_THRESHOLD"),
])
def test_a_pending_repair_or_unrepairable_memory_fails(line: str, name: str, code: str) -> None:
    r = nvidia_smi.parse(sample(Q).replace(line, line.replace(": No", ": Yes")), "n", NOW)
    assert r.status == "fail" and (name, "fail", code) in found(r)


def test_thermal_margin_under_load_against_the_configured_floor() -> None:
    """After 20 s of bf16 matmuls the GPU had 3 C of margin: above the default floor (-2 C, where
    this GPU's own `GPU Slowdown T.Limit Temp` sits), below a profile that asks for 5 C."""
    text = sample("nvidia-smi-q-d-h100-580-after-20s-bf16-load.txt")
    r = nvidia_smi.parse(text, "n", NOW)
    assert ("thermal.margin", "pass", None) in found(r) and r.status == "pass"
    _, strict = read(text, "n", "nvidia-smi", NOW, thermal_margin_min=5.0)
    assert ("thermal.margin", "fail", "THERMAL") in found(strict)
    hot = text.replace("GPU T.Limit Temp                               : 3 C",
                       "GPU T.Limit Temp                               : -5 C")
    assert ("thermal.margin", "fail", "THERMAL") in found(nvidia_smi.parse(hot, "n", NOW))


def test_the_other_healthy_readings_of_the_capture_pass() -> None:
    """`-q -d ECC,PAGE_RETIREMENT,...` prints the new repair fields without a recovery action line;
    `--query-gpu` carries none of them."""
    r = nvidia_smi.parse(sample("nvidia-smi-q-d-h100-580-ecc-retirement-clocks.txt"), "n", NOW)
    assert r.status == "pass" and {("gpu.repair", "pass", None), ("retired_pages", "skip", None)} <= found(r)
    assert not [c for c in r.checks if c.name == "gpu.recovery_action"], "no line, no verdict"
    r = nvidia_smi.parse(sample("nvidia-smi-csv-h100-580-query-gpu.txt"), "n", NOW, expect_gpus=1)
    assert r.status == "pass" and ("pcie.link", "pass", None) in found(r)


# -- 4. -q -x ---------------------------------------------------------------------------------

def test_the_xml_form_gives_the_checks_of_the_text_form() -> None:
    text, xml = sample(Q), sample(QX)
    assert detect(xml.split("\n", 1)[1]) == "nvidia-smi", "without its prompt line too"
    a = nvidia_smi.parse(text, "n", NOW, expect_gpus=1)
    b = nvidia_smi.parse(xml, "n", NOW, expect_gpus=1)
    assert b.status == "pass"
    assert [(c.name, c.status, c.message) for c in a.checks] == [(c.name, c.status, c.message) for c in b.checks]
    assert {m.name for m in a.metrics} == {m.name for m in b.metrics}


def test_faults_in_the_xml_are_read() -> None:
    xml = (sample(QX).replace("<gpu_recovery_action>None<", "<gpu_recovery_action>Reboot<")
           .replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<")
           .replace("<gpu_temp_tlimit>45 C<", "<gpu_temp_tlimit>-4 C<")
           .replace("<clocks_event_reason_hw_slowdown>Not Active<", "<clocks_event_reason_hw_slowdown>Active<"))
    r = nvidia_smi.parse(xml, "n", NOW)
    assert {("gpu.recovery_action", "fail", "RECOVERY_REBOOT"), ("row_remap", "fail", "REMAP_PENDING"),
            ("thermal.margin", "fail", "THERMAL"), ("clocks.events", "warn", None)} <= found(r)


@pytest.mark.parametrize("change,why", [
    (lambda x: x.replace('<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
                         '<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>')
     .replace("<driver_version>580.159.04<", "<driver_version>&b;<"), "entity"),
    (lambda x: x.replace('<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">',
                         '<!DOCTYPE nvidia_smi_log SYSTEM "file:///etc/passwd" [<!ELEMENT x ANY>]>'), "DOCTYPE"),
    (lambda x: x[:len(x) // 2], "well-formed"),
    (lambda x: x.replace("<product_brand>", "<a>" * 40 + "</a>" * 40 + "<product_brand>"), "deeper"),
    (lambda x: x.replace("<product_name>", "<product_name>&undefined;"), "well-formed"),
])
def test_xml_that_is_not_nvidia_smis_is_an_error(change, why: str) -> None:
    r = nvidia_smi.parse(change(sample(QX)), "n", NOW)
    assert r.status == "error" and why in r.checks[0].message, found(r)


# -- 5. nvlink -s -----------------------------------------------------------------------------

def test_nvlink_status_that_printed_nothing_is_an_error() -> None:
    """`nvidia-smi nvlink -s` on this GPU (no NVLink reachable in the VM) printed nothing, exit 0."""
    fmt, r = read(sample("nvidia-smi-nvlink-s-h100-580-prints-nothing.txt"), "n", "auto", NOW)
    assert fmt == "nvidia-smi" and r.status == "error"
