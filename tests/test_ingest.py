"""`sweeper ingest` and `sweeper profiles`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.history import History

FIX = Path(__file__).parent / "parsers" / "fixtures"


@pytest.mark.parametrize("fixture,found,status", [
    ("dcgm-4x-l2-pcie-fail.json", "dcgm", "fail"), ("dcgm-4x-l2-pass.json", "dcgm", "pass"),
    ("nccl-allreduce-h100.txt", "nccl", "pass"), ("dmesg-xid79.txt", "kernel-log", "fail"),
    ("nvidia-smi-q-h100-healthy.txt", "nvidia-smi", "pass"), ("nvidia-smi-q-h100-faulty.txt", "nvidia-smi", "fail"),
    ("nvidia-smi-csv-h100.txt", "nvidia-smi", "fail"), ("ibv-devinfo-efa.txt", "ibv-devinfo", "pass"),
    # An EFA port's state is no finding: the EFA driver reports every port ACTIVE (amzn/amzn-drivers,
    # kernel/linux/efa/src/efa_verbs.c, efa_query_port), so a DOWN one in a pasted file is not judged.
    ("ibv-devinfo-efa-port-down.txt", "ibv-devinfo", "pass"), ("fi-info-libfabric2-p5en.txt", "fi-info", "pass"),
    ("fi-info-none.txt", "fi-info", "fail"), ("topo-p5-h100.txt", "topo", "pass"),
])
def test_ingest_detects_parses_and_records(tmp_path: Path, fixture: str, found: str, status: str) -> None:
    state = tmp_path / "h.db"
    res = CliRunner().invoke(main, ["ingest", "gpu-9", str(FIX / fixture), "--new-node", "--state", str(state), "--json"])
    assert res.exit_code == (0 if status == "pass" else 1), res.output
    assert json.loads(res.stdout)["status"] == status
    h = History(state)
    sweep = h.node_history("gpu-9")["sweeps"][0]
    assert (sweep["playbook"], sweep["verdict"], sweep["kind"]) == (f"ingest:{found}", status, "ingest")
    assert h.last_swept() == {}, "an ingested result is not a sweep"
    h.close()


def test_ingest_bad_input(tmp_path: Path) -> None:
    garbage = tmp_path / "g.txt"
    garbage.write_text("nothing a parser knows\n")
    res = CliRunner().invoke(main, ["ingest", "n", str(garbage), "--no-record"])
    assert res.exit_code == 2 and "cannot tell the format" in res.stderr
    res = CliRunner().invoke(main, ["ingest", "n", str(garbage), "--format", "dcgm", "--no-record", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["status"] == "error"
    res = CliRunner().invoke(main, ["ingest", "n", str(garbage), "--format", "nvidia-smi", "--no-record", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["status"] == "error"
    res = CliRunner().invoke(main, ["ingest", "n", str(garbage), "--format", "smi"])
    assert res.exit_code == 2


def test_profiles_and_which_node_gets_which(make_sim) -> None:
    sim = make_sim(node_groups=[{"name_prefix": "p5-", "count": 1, "instance_type": "p5.48xlarge"},
                                {"name_prefix": "b2-", "count": 1, "instance_type": "p6-b200.48xlarge"},
                                {"name_prefix": "cpu-", "count": 1, "instance_type": "m7i.4xlarge",
                                 "labels": {"nvidia.com/gpu.present": "true"}}])
    res = CliRunner().invoke(main, ["profiles", "--nodes", "--kubeconfig", str(sim.kubeconfig), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {p["profile"] for p in doc["profiles"]} >= {"p5.48xlarge", "default"}
    # cpu-00 carries the GPU Operator's label but no GPU in its capacity: not a GPU node
    assert {n["node"]: n["profile"] for n in doc["nodes"]} == {"p5-00": "p5.48xlarge", "b2-00": "p6-b200.48xlarge"}


def test_ingest_judges_against_a_profile(tmp_path: Path) -> None:
    args = ["ingest", "gpu-9", "--no-record", "--json"]
    res = CliRunner().invoke(main, args[:2] + [str(FIX / "fi-info-libfabric2-p5en.txt")] + args[2:]
                             + ["--profile", "p5.48xlarge"])
    assert res.exit_code == 1 and "the profile expects 32" in res.stdout, "p5 has 32 EFA devices, this capture 16"
    res = CliRunner().invoke(main, args[:2] + [str(FIX / "fi-info-libfabric2-p5en.txt")] + args[2:]
                             + ["--profile", "p5en.48xlarge"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, args[:2] + [str(FIX / "topo-poor-affinity.txt")] + args[2:]
                             + ["--profile", "azure-nd-h100-v5"])
    assert res.exit_code == 1 and "NIC_AFFINITY" in res.stdout
    res = CliRunner().invoke(main, args[:2] + [str(FIX / "topo-p5-h100.txt")] + args[2:] + ["--profile", "nope"])
    assert res.exit_code == 2 and "no profile 'nope'" in res.stderr


def test_ingest_folds_an_xid_storm_into_one_finding(tmp_path: Path) -> None:
    lines = [f"[{9000 + i}.000000] NVRM: Xid (PCI:0000:18:00): 13, pid={2000 + i}, name=python3, "
             f"Graphics Exception: ESR 0x405840=0x10000" for i in range(500)]
    lines.append("[9600.000000] nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 46 egress "
                 "non-posted PRIV error")
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(main, ["ingest", "gpu-9", str(log), "--no-record", "--json"])
    doc = json.loads(res.stdout)
    assert [(c["name"], c["code"], c["status"]) for c in doc["checks"]] == [("xid", "13", "warn"),
                                                                            ("sxid", "12028", "warn")]
    assert doc["checks"][0]["message"].startswith("XID 13 (") and " x500: " in doc["checks"][0]["message"]
    assert doc["checks"][1]["message"].startswith("SXID 12028 on NVSwitch 0000:05:00: Non-fatal, Link 46")
    assert {(m["name"], m["value"]) for m in doc["metrics"]} == {("xid.13", 500.0), ("sxid.12028", 1.0)}


def test_a_fatal_nvswitch_error_fails_and_reboots(tmp_path: Path) -> None:
    from sweeper.policy import decide

    log = tmp_path / "dmesg.txt"
    log.write_text("[100.0] nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 30 sourcetrack TCEN0 "
                   "crumbstore ECC DBE Error\n"
                   "[101.0] nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 30 sourcetrack TCEN0 "
                   "crumbstore ECC DBE Error\n")
    res = CliRunner().invoke(main, ["ingest", "gpu-9", str(log), "--no-record", "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert [(c["name"], c["status"], c["severity"]) for c in doc["checks"]] == [("sxid", "fail", "critical")]
    assert " x2: Fatal, Link 30" in doc["checks"][0]["message"]
    v = decide([doc])
    assert v.verdict == "reboot", "not looked up as XID 24007 in the XID catalogue"


def _ingest_json(path: Path, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    res = CliRunner().invoke(main, ["ingest", "gpu-9", str(path), "--no-record", "--json", *extra])
    return res.exit_code, (json.loads(res.stdout) if res.exit_code in (0, 1) else {})


def test_a_kernel_log_is_streamed_whatever_its_size_and_garbage_is_an_error(tmp_path: Path) -> None:
    """A log far longer than what is read of other formats is read to its end (the XID is on its
    last line); one endless line, random bytes or a JSON document is not a kernel log."""
    big = tmp_path / "dmesg.txt"
    line = "[ 1234.567890] eth0: link up, 100Gbps, full duplex, some chatter to pad the line out\n"
    with big.open("w") as f:
        for _ in range(300_000):
            f.write(line)
        f.write("[ 9999.000001] NVRM: Xid (PCI:0000:5d:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
    assert big.stat().st_size > 16 * 1024 * 1024
    from sweeper import ingest

    code, doc = _ingest_json(big, "--format", "kernel-log")
    assert (code, doc["status"], doc["checks"][-1]["code"]) == (1, "fail", "79")
    one_line = tmp_path / "one-line.txt"
    one_line.write_bytes(b"x" * (3 * ingest.MAX_LINE + 5))
    for path in (one_line, FIX / "dcgm-4x-l2-pass.json"):
        code, doc = _ingest_json(path, "--format", "kernel-log")
        assert (code, doc["status"]) == (1, "error"), path


def test_input_over_the_cap_is_cut_and_the_result_says_so(tmp_path: Path) -> None:
    import io

    from sweeper.ingest import ingest_stream

    text = (FIX / "nccl-allreduce-h100.txt").read_bytes()
    found, whole = ingest_stream(io.BytesIO(text), "n1", "auto", now=0.0)
    assert found == "nccl" and whole.status == "pass"
    found, cut = ingest_stream(io.BytesIO(text), "n1", "nccl", now=0.0, limit=len(text) // 2)
    assert cut.status in ("fail", "error") and any(c.code == "INPUT_CUT" for c in cut.checks)


@pytest.mark.parametrize("text,fmt", [
    ("  [1,0]<stdout>:#  Rank  0 Group  0 Pid 1 on h device  0 [0x00] NVIDIA H100\n"
     "  [1,0]<stdout>:     8    2     float     sum      -1    30.11    0.00    0.00      0    29.85    0.00    0.00      0\n",
     "nccl"),
    ("Defaulted container \"nvidia-dcgm-ctr\"\n{\"DCGM Diagnostic\": {\"test_categories\": []}}\n", "dcgm"),
    ("| GPU Memory                | Fail - GPU: 0                                  |\n", "dcgm"),
    ("Memory Bandwidth              Pass - All\nGPU Memory                    Fail - GPU: 2\n", "dcgm"),
    ("2024-05-01T10:00:00+00:00 node-1 kernel: eth0: link up\n"
     "2024-05-01T10:00:01+00:00 node-1 kernel: eth1: link up\n", "kernel-log"),
])
def test_auto_detection_names_the_format_it_chose(tmp_path: Path, text: str, fmt: str) -> None:
    f = tmp_path / "in.txt"
    f.write_text(text)
    code, doc = _ingest_json(f)
    assert code in (0, 1) and doc["source"] == fmt
