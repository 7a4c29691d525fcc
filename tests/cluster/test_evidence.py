"""A held node's evidence, end to end against the simulated cluster: the check fails, the node is
held for replacement, the evidence Job runs on it before Karpenter removes it, the bundle is kept
by node and run, and `sweeper history NODE --evidence RUN` writes it out after the node is gone.

Upstream practice this answers:
- EKS node health: a node's logs are collected and uploaded to S3 when it fails, so they outlive
  the node (https://docs.aws.amazon.com/eks/latest/userguide/auto-get-logs.html, NodeDiagnostic);
- GoogleCloudPlatform/cluster-health-scanner #75/#76: run nvidia-bug-report.sh when a GPU check
  fails and keep the report (uploaded to a bucket) for debugging.
The pod log carries the bundle: a termination message is cut at 4096 bytes
(https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/), and the
kubelet rotates a container's log past containerLogMaxSize, 10Mi by default
(https://kubernetes.io/docs/reference/config-api/kubelet-config.v1beta1/)."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sweeper.checks.evidence import read_manifest
from sweeper.cli import main
from sweeper.history import History
from tests.conftest import KARPENTER, Sim, pool_fleet, run_sweep


def members(bundle: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_a_replaced_node_keeps_its_evidence_after_karpenter_removes_it(make_sim, history: History,
                                                                      tmp_path: Path, monkeypatch) -> None:
    sim: Sim = make_sim(pool_fleet(3, {"gpu-01": {"remap_failure": [4], "nvlink_down": [2]}}))
    report = run_sweep(sim, history, KARPENTER)
    assert {o.node: o.verdict for o in report.outcomes}["gpu-01"] == "replace"
    assert "gpu-01" not in {n.metadata.name for n in sim.core.list_node().items}, "Karpenter took the node away"
    runs = history.evidence_runs("gpu-01")
    assert [r["run_id"] for r in runs] == [report.run_id]
    assert history.evidence_runs("gpu-00") == [], "a node handed back keeps no evidence"
    row = history.evidence_of("gpu-01", report.run_id)
    assert row is not None and row["data"] is not None
    manifest = read_manifest(row["data"])
    status = {p["file"]: p["status"] for p in manifest["parts"]}
    assert status["kernel.log"] == "collected" and status["nvidia-smi-q.txt"] == "collected"
    assert status["nvlink-status.txt"] == "collected"
    assert status["nvidia-bug-report.log.gz"] == "missing", "not in the image: noted, never a failure"
    files = members(row["data"])
    assert b"<inactive>" in files["nvlink-status.txt"], "the NVLink that is down shows in the bundle"
    assert b"DRAM Uncorrectable" in files["nvidia-smi-q.txt"]
    # the evidence Job ran and was deleted like every other
    assert not [j for j in sim.batch.list_namespaced_job(KARPENTER.check_namespace).items]
    monkeypatch.chdir(tmp_path)
    cli = CliRunner()
    out = cli.invoke(main, ["history", "gpu-01", "--state", str(history.path)])
    assert out.exit_code == 0, out.output
    assert "evidence kept" in out.output and report.run_id in out.output
    out = cli.invoke(main, ["history", "gpu-01", "--state", str(history.path), "--evidence", report.run_id,
                            "--to", "b.tar.gz"])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "b.tar.gz").read_bytes() == row["data"]
    again = cli.invoke(main, ["history", "gpu-01", "--state", str(history.path), "--evidence", report.run_id,
                              "--to", "b.tar.gz"])
    assert again.exit_code == 2 and "--force" in again.output, "an existing file is not overwritten"
    doc = json.loads(cli.invoke(main, ["history", "gpu-01", "--state", str(history.path), "-o", "json"]).output)
    assert [e["run_id"] for e in doc["evidence"]] == [report.run_id]


def test_no_evidence_is_never_a_finding_and_the_remedy_goes_on(make_sim, history: History) -> None:
    """An evidence Job that cannot finish (here: a deadline shorter than the collection) keeps no
    bundle and says why in an action row; the verdict and Karpenter's replacement stand."""
    sim: Sim = make_sim(pool_fleet(2, {"gpu-01": {"remap_failure": [4]}}))
    report = run_sweep(sim, history, replace(KARPENTER, evidence_timeout=20))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "replace"}
    assert "gpu-01" not in {n.metadata.name for n in sim.core.list_node().items}
    assert history.evidence_runs("gpu-01") == []
    said = [a["detail"] for a in history.db.query("select detail from actions where node = 'gpu-01' "
                                                  "and action = 'evidence'")]
    # (on a loaded machine the pod may not even start within the deadline: no bundle either way)
    assert said and said[0].startswith("none kept: ") and ("within 20s" in said[0] or "deadline" in said[0])
    checks = [c["name"] for c in history.db.query("select name from checks where node = 'gpu-01'")]
    assert not any(n.startswith("evidence") or n == "check.deadline" for n in checks), "nothing judged of it"


def test_with_a_bucket_the_bundle_goes_to_s3_and_outlives_the_node(make_sim, history: History, tmp_path: Path,
                                                                   monkeypatch, s3: Any) -> None:
    sim: Sim = make_sim(pool_fleet(2, {"gpu-01": {"remap_failure": [4]}}))
    report = run_sweep(sim, history, replace(KARPENTER, evidence_bucket="gpu-evidence"))
    assert "gpu-01" not in {n.metadata.name for n in sim.core.list_node().items}
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="gpu-evidence").get("Contents", [])]
    assert keys == [f"sweeper-evidence/{history.cluster}/gpu-01/{report.run_id}.tar.gz"]
    row = history.evidence_of("gpu-01", report.run_id)
    assert row is not None and row["data"] is None and row["location"] == f"s3://gpu-evidence/{keys[0]}"
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["history", "gpu-01", "--state", str(history.path), "--evidence",
                                    report.run_id, "--to", "-"])
    assert out.exit_code == 0, out.output
    assert read_manifest(out.stdout_bytes)["node"] == "gpu-01"


@pytest.mark.parametrize("forgery", ["longname-bomb", "pax-bomb"])
def test_a_forged_bundle_that_claims_a_terabyte_is_refused_and_the_run_goes_on(make_sim, history: History,
                                                                                forgery: str) -> None:
    """A hostile node prints its own evidence log: a tar.gz of a few kilobytes whose first header is
    a GNU long name or a PAX header claiming 2**40 bytes. Python's tarfile reads such a header's data
    in one read of the claimed size before it returns the first member (a MemoryError, or the
    controller's 1Gi limit at a few hundred megabytes: a 1 MB gzip of zeros inflates to 1 GiB).
    The reader takes the first 512-byte header as it is and inflates no more than the manifest's cap,
    so the bundle is refused in words, and the verdict and the remedy stand (issue: adversarial
    review of the evidence bundle)."""
    sim: Sim = make_sim(pool_fleet(2, {"gpu-01": {"remap_failure": [4], "forged_evidence": forgery}}))
    report = run_sweep(sim, history, KARPENTER)
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "replace"}
    assert "gpu-01" not in {n.metadata.name for n in sim.core.list_node().items}, "the remedy went on"
    assert history.evidence_runs("gpu-01") == []
    said = [a["detail"] for a in history.db.query("select detail from actions where node = 'gpu-01' "
                                                  "and action = 'evidence'")]
    assert said == ["none kept: the bundle's first member is not its manifest"]
