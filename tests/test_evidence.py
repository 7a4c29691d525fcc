"""The evidence bundle of a held node: collected bounded on the node, carried in the pod's log,
kept by node and run in the history (SQLite and PostgreSQL) or S3 (moto), and written out whole.

Upstream practice this answers: EKS uploads a failing node's logs to S3 at failure time
(https://docs.aws.amazon.com/eks/latest/userguide/auto-get-logs.html, NodeDiagnostic), and
GoogleCloudPlatform/cluster-health-scanner #75/#76 run nvidia-bug-report.sh when a GPU check fails
and keep the report. A termination message is cut at 4096 bytes and the kubelet rotates a container
log past containerLogMaxSize (10Mi by default), so the bundle rides the log under a cap well below
it (https://kubernetes.io/docs/reference/config-api/kubelet-config.v1beta1/)."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sweeper.actions.safety import EVIDENCE_PATHS, HOST_PATHS, Rules, problems
from sweeper.aws import EvidenceBucket
from sweeper.checks.evidence import (
    BEGIN,
    END,
    MANIFEST,
    MANIFEST_LIMIT,
    BundleError,
    collect,
    emit,
    extract,
    read_manifest,
)
from sweeper.checks.fake import FakeHost
from sweeper.cli import main
from sweeper.history import History

MiB = 1024 * 1024


class BugReportHost(FakeHost):
    """A host whose image has nvidia-bug-report.sh: it writes its .gz where it is told."""

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        if argv[0] == "nvidia-bug-report.sh":
            self.ran.append(list(argv))
            out = Path(argv[argv.index("--output-file") + 1])
            Path(str(out) + ".gz").write_bytes(gzip.compress(b"nvidia-bug-report log\n" * 100))
            return 0, "", ""
        return super().run(argv, timeout, env)


def members(bundle: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def parts(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["file"]: p for p in manifest["parts"]}


def test_a_missing_tool_or_file_is_noted_never_a_failure() -> None:
    got = collect(FakeHost(commands={"dmesg": (0, "[ 1.0] NVRM: Xid (PCI:0000:18:00): 79\n", "")}), "gpu-1", now=5.0)
    p = parts(got.manifest)
    assert p["kernel.log"]["status"] == "collected"
    assert p["nvidia-smi-q.txt"]["status"] == "missing" and "not in the image" in p["nvidia-smi-q.txt"]["why"]
    assert p["nvidia-bug-report.log.gz"]["status"] == "missing"
    assert p["fabricmanager.log"]["status"] == "missing" and "/var/log/fabricmanager.log" in p["fabricmanager.log"]["why"]
    files = members(got.bundle)
    assert list(files)[0] == MANIFEST, "the manifest is the first member: a reader needs no other"
    assert b"Xid" in files["kernel.log"] and "nvidia-smi-q.txt" not in files


def test_the_bug_report_is_kept_where_the_image_has_it(tmp_path: Path) -> None:
    host = BugReportHost(commands={"nvidia-smi": (0, "==============NVSMI LOG==============\n", "")},
                         files={"/var/log/nv-hostengine.log": "DCGM started\n"})
    got = collect(host, "gpu-1", now=5.0, scratch=str(tmp_path))
    p = parts(got.manifest)
    assert p["nvidia-bug-report.log.gz"]["status"] == "collected"
    assert gzip.decompress(members(got.bundle)["nvidia-bug-report.log.gz"]).startswith(b"nvidia-bug-report")
    assert p["nv-hostengine.log"]["status"] == "collected"
    assert ["nvidia-bug-report.sh", "--safe-mode"] in [r[:2] for r in host.ran], "in safe mode, into scratch space"


def test_each_part_keeps_its_tail_and_the_whole_bundle_stays_under_its_cap() -> None:
    # random-looking text that gzip cannot shrink much: 12 MiB of kernel log
    noise = base64.b64encode(os.urandom(9 * MiB)).decode()
    lines = "\n".join(noise[i:i + 100] for i in range(0, len(noise), 100)) + "\nTHE LAST LINE\n"
    got = collect(FakeHost(commands={"dmesg": (0, lines, ""), "nvidia-smi": (0, "GPU 00000000:18:00.0\n" * 2000, "")}),
                  "gpu-1", cap=512 * 1024, now=5.0)
    assert parts(got.manifest)["nvidia-smi-q.txt"]["status"] == "collected", "the flood is cut, not its neighbours"
    assert len(got.bundle) <= 512 * 1024
    k = parts(got.manifest)["kernel.log"]
    assert k["status"] == "cut" and k["original_bytes"] == len(lines.encode()) and k["bytes"] < k["original_bytes"]
    assert "512" in k["why"] or "cap" in k["why"]
    assert members(got.bundle)["kernel.log"].endswith(b"THE LAST LINE\n"), "the tail is what is kept"


def test_the_log_carries_the_bundle_and_a_cut_or_forged_one_is_refused() -> None:
    got = collect(FakeHost(commands={"dmesg": (0, "x\n", "")}), "gpu-1", now=5.0)
    log = "evidence: 1 part\n" + emit(got.bundle)
    assert extract(log, 2 * MiB) == got.bundle
    assert read_manifest(extract(log, 2 * MiB))["node"] == "gpu-1"
    with pytest.raises(BundleError, match="markers"):
        extract(log[: len(log) // 2], 2 * MiB)  # the log was cut: no end marker
    with pytest.raises(BundleError, match="cap"):
        extract(log, 100)
    with pytest.raises(BundleError, match="gzip"):
        extract(f"{BEGIN}\n{base64.b64encode(b'not gzip').decode()}\n{END}\n", 2 * MiB)


def _tar(members_: list[tarfile.TarInfo], data: bytes = b"x") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for m in members_:
            if m.isfile():
                m.size = len(data)
                tar.addfile(m, io.BytesIO(data))
            else:
                tar.addfile(m)
    return buf.getvalue()


def test_a_bundle_whose_first_member_is_not_its_manifest_is_refused() -> None:
    evil = tarfile.TarInfo("../../etc/cron.d/x")
    link = tarfile.TarInfo(MANIFEST)
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    for bundle in (_tar([evil]), _tar([link])):
        with pytest.raises(BundleError, match="manifest"):
            read_manifest(bundle)


def test_a_manifest_nested_past_the_parsers_depth_or_too_long_is_refused_in_words() -> None:
    """json.loads raises RecursionError (no ValueError) on `[` nested a few thousand deep: a forged
    manifest of 200 kB of `[` must be a refused bundle, not an exception that ends the run."""
    deep, long = tarfile.TarInfo(MANIFEST), tarfile.TarInfo(MANIFEST)
    with pytest.raises(BundleError, match="unreadable"):
        read_manifest(_tar([deep], b"[" * 200_000))
    with pytest.raises(BundleError, match="not its manifest"):
        read_manifest(_tar([long], b" " * (MANIFEST_LIMIT + 1)))


def _bundle(names: list[str]) -> tuple[bytes, dict[str, Any]]:
    manifest = {"schema": "sweeper.evidence/v1", "node": "gpu-1", "collected_at": 1.0, "boot_id": None,
                "cap_bytes": 1, "parts": [{"file": n, "status": "collected"} for n in names]}
    first = tarfile.TarInfo(MANIFEST)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        body = json.dumps(manifest).encode()
        first.size = len(body)
        tar.addfile(first, io.BytesIO(body))
        for n in names:  # what a node could put there: paths out of the directory, links
            info = tarfile.TarInfo(n)
            if n.endswith("link"):
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue(), manifest


def test_history_keeps_bundles_by_node_and_run_under_a_total_cap(new_state: Callable[[str], str]) -> None:
    h = History(new_state("h.db"))
    a, ma = _bundle(["kernel.log"])
    h.keep_evidence("run-1", "gpu-1", 10.0, a, ma)
    assert h.evidence_of("gpu-1", "run-1")["data"] == a  # type: ignore[index]
    assert h.evidence_of("gpu-1", "run-2") is None and h.evidence_of("gpu-2", "run-1") is None
    dropped = h.keep_evidence("run-2", "gpu-2", 20.0, a, ma, keep_bytes=len(a) + 10)
    assert dropped == [("gpu-1", "run-1")], "the oldest bundle's bytes go first"
    old = h.evidence_of("gpu-1", "run-1")
    assert old is not None and old["data"] is None and old["location"] == "pruned"
    assert h.evidence_of("gpu-2", "run-2")["data"] == a  # type: ignore[index]
    assert [r["run_id"] for r in h.evidence_runs("gpu-1")] == ["run-1"], "the row says what was kept, and lost"
    h.prune(before=15.0)  # no sweep is older: evidence rows go with the sweeps they belong to
    h.close()


def test_listing_a_bundle_sanitizes_the_names_the_node_wrote(new_state: Callable[[str], str]) -> None:
    h = History(new_state("h.db"))
    bundle, manifest = _bundle(["../../etc/x", "a\x1b[31mred", "evil-link"])
    h.keep_evidence("run-1", "gpu-1", 10.0, bundle, manifest)
    names = set(h.evidence_runs("gpu-1")[0]["parts"])
    assert names == {".._.._etc_x", "a__31mred", "evil-link"}
    h.close()


def test_history_evidence_writes_the_tar_whole_and_never_extracts_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "h.db"
    h = History(state)
    bundle, manifest = _bundle(["../../escaped", "evil-link"])
    h.keep_evidence("run-1", "gpu-1", 10.0, bundle, manifest)
    h.close()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.chdir(out_dir)
    cli = CliRunner()
    done = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1"])
    assert done.exit_code == 0, done.output
    assert sorted(os.listdir(out_dir)) == ["evidence-gpu-1-run-1.tar.gz"], "one file, nothing extracted"
    assert (out_dir / "evidence-gpu-1-run-1.tar.gz").read_bytes() == bundle
    assert not (tmp_path / "escaped").exists()
    again = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1"])
    assert again.exit_code == 2 and "--force" in again.output
    (out_dir / "link.tar.gz").symlink_to(tmp_path / "target")
    through = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1", "--to",
                                "link.tar.gz", "--force"])
    # --force replaces the link itself (a rename over it, sweeper.files), never writes through it
    assert through.exit_code == 0 and not (tmp_path / "target").exists(), "never written through a symlink"
    assert not (out_dir / "link.tar.gz").is_symlink() and (out_dir / "link.tar.gz").read_bytes() == bundle
    (out_dir / "link.tar.gz").unlink()
    (out_dir / "link.tar.gz").symlink_to(tmp_path / "target")
    refused = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1", "--to",
                                "link.tar.gz"])
    assert refused.exit_code == 2 and "--force" in refused.output and (out_dir / "link.tar.gz").is_symlink()
    assert not (tmp_path / "target").exists()
    (out_dir / "link.tar.gz").unlink()
    forced = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1", "--force"])
    assert forced.exit_code == 0
    stdout = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1", "--to", "-"])
    assert stdout.exit_code == 0 and stdout.stdout_bytes == bundle
    missing = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-9"])
    assert missing.exit_code == 2 and "run-1" in missing.output, "it names the runs that have evidence"
    stray = cli.invoke(main, ["history", "gpu-1", "--state", str(state), "--force"])
    assert stray.exit_code == 2 and "--evidence" in stray.output


def test_a_bundle_in_s3_is_written_out_from_there_and_checked(s3: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    bundle, manifest = _bundle(["kernel.log"])
    bucket = EvidenceBucket("gpu-evidence", "sweeper-evidence/")
    key = bucket.key("prod", "gpu-1", "run-1")
    assert key == "sweeper-evidence/prod/gpu-1/run-1.tar.gz"
    where = bucket.put(key, bundle, hashlib.sha256(bundle).hexdigest())
    state = tmp_path / "h.db"
    h = History(state)
    h.keep_evidence("run-1", "gpu-1", 10.0, bundle, manifest, location=where)
    assert h.evidence_of("gpu-1", "run-1")["data"] is None, "the history keeps where it is, not its bytes"  # type: ignore[index]
    h.close()
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1", "--to", "-"])
    assert done.exit_code == 0, done.output
    assert done.stdout_bytes == bundle
    s3.put_object(Bucket="gpu-evidence", Key=key, Body=b"\x1f\x8bswapped")
    swapped = CliRunner().invoke(main, ["history", "gpu-1", "--state", str(state), "--evidence", "run-1", "--to", "-"])
    assert swapped.exit_code == 2 and "digest" in swapped.output


def test_only_the_evidence_job_may_mount_the_hosts_var_log() -> None:
    pod = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "sweeper-checks"},
           "spec": {"template": {"spec": {"volumes": [{"name": "log", "hostPath": {"path": "/var/log",
                                                                                    "type": "Directory"}}],
                                          "containers": [{"name": "c", "image": "i"}]}}}}
    rules = Rules(namespace="sweeper-checks", affinities=(), tolerations=(), taint_key="k", images=frozenset({"i"}))
    assert any("/var/log" in p for p in problems([pod], rules)), "a check Job may not"
    assert not any("/var/log" in p and "not one the checks read" in p
                   for p in problems([pod], Rules(**{**rules.__dict__, "host_paths": EVIDENCE_PATHS})))
    assert "/var/log" not in HOST_PATHS


def test_a_bundle_made_on_a_real_h100_reads_back_whole() -> None:
    """`python -m sweeper evidence --host-root /` as root on a real NVIDIA H100 80GB HBM3 (driver
    580.159.04, a VM with no journal files, no NVLink, no DCGM or Fabric Manager, no
    nvidia-bug-report.sh), 2026-11-25: 11,678 bytes in 0.64 s. Its log is read back as the sweep reads a
    pod's log; the manifest says what was there and why the rest was not."""

    from sweeper.checks.evidence import extract, read_manifest
    log = (Path(__file__).parent / "data" / "h100-580" / "evidence-log.txt").read_text()
    bundle = extract(log, 2 * 2**20)
    manifest = read_manifest(bundle)
    status = {p["file"]: p["status"] for p in manifest["parts"]}
    assert status == {"kernel.log": "collected", "nvidia-smi-q.txt": "collected", "nvlink-status.txt": "collected",
                      "fabricmanager.log": "missing", "nv-hostengine.log": "missing",
                      "nvidia-bug-report.log.gz": "missing"}
    why = {p["file"]: p["why"] for p in manifest["parts"]}
    assert why["nvlink-status.txt"] == "nvidia-smi nvlink -s printed nothing"
    assert "not in the image" in why["nvidia-bug-report.log.gz"]
    with tarfile.open(fileobj=io.BytesIO(bundle)) as tar:
        smi = tar.extractfile("nvidia-smi-q.txt").read().decode()  # type: ignore[union-attr]
    assert "NVIDIA H100 80GB HBM3" in smi and "GPU Recovery Action" in smi
