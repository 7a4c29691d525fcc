"""The DCGM image by the node's driver branch (config `dcgm_images`), and the diagnostic's words when the
image's DCGM build does not fit the driver: a fault of the check, never of the node.

Facts this pins:
- DCGM 4.x ships one build per CUDA major (datacenter-gpu-manager-4-cuda12, -cuda13); nvvs loads its
  plugins from plugins/cuda<the major the driver runs>/ and throws "Cannot load plugins. Unable to change
  to the plugin dir ..." without them (NVIDIA/DCGM: nvvs/include/TestFramework.inl; docker/Dockerfile.ubuntu22.04
  installs both packages from 4.4 on, only -cuda12 in 4.2.3).
- CUDA 13.x runs on driver branch >= 580, CUDA 12.x on >= 525, 11.x on >= 450
  (https://docs.nvidia.com/deploy/cuda-compatibility/,
  https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#cuda-driver).
- GPU feature discovery labels nvidia.com/cuda.runtime-version.major (the CUDA major of the driver),
  nvidia.com/cuda.driver-version.major (the driver's branch), and the deprecated cuda.runtime.major and
  cuda.driver.major (NVIDIA/k8s-device-plugin: internal/lm/nvml.go; docs/gpu-feature-discovery/README.md).
- cudaErrorInsufficientDriver: "CUDA driver version is insufficient for CUDA runtime version"
  (https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.admission import shapes
from sweeper.cli import main
from sweeper.config import UNPUBLISHED, Config, load_config
from sweeper.drivers import branch_of, cuda_of_branch, node_cuda_major
from sweeper.errors import ConfigError
from sweeper.parsers import dcgm

ROOT = Path(__file__).resolve().parent.parent
IMG12 = "nvcr.io/nvidia/cloud-native/dcgm:4.4.2-1-cuda12@sha256:" + "1" * 64
IMG13 = "nvcr.io/nvidia/cloud-native/dcgm:4.4.2-1-cuda13@sha256:" + "3" * 64
CFG = Config(dcgm_images={12: IMG12, 13: IMG13})


def node(labels: dict[str, str] | None = None, driver: str | None = None) -> dict:
    n = {"name": "n1", "gpus": 8, "annotations": {}, "profile": {"gpus": 8},
         "labels": {"kubernetes.io/hostname": "n1", **(labels or {})}}
    return {**n, "driver_version": driver} if driver else n


def test_the_config_key_takes_cuda_majors_to_pinned_images(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f'dcgm_images:\n  12: {IMG12}\n  "13": {IMG13}\n')
    assert load_config(path).dcgm_images == {12: IMG12, 13: IMG13}
    path.write_text("dcgm_images:\n  13: nvcr.io/nvidia/cloud-native/dcgm:4.4.2-1-ubuntu22.04\n")
    with pytest.raises(ConfigError, match=r":2: dcgm_images\[13\]: .* does not match"):
        load_config(path)  # a tag alone is refused: every image is pinned by digest
    path.write_text(f"dcgm_images:\n  cuda13: {IMG13}\n")
    with pytest.raises(ConfigError, match=r":2: dcgm_images.cuda13: .*integer"):
        load_config(path)  # a key that is no CUDA major


def test_every_dcgm_image_is_in_the_allowed_set() -> None:
    assert {IMG12, IMG13, CFG.dcgm_image} <= CFG.job_images


@pytest.mark.parametrize("driver,cuda", [("580.65.06", 13), ("580.95.05", 13), ("575.57.08", 12),
                                         ("570.133.20", 12), ("525.60.13", 12), ("470.256.02", 11),
                                         ("418.40", None), ("garbage", None)])
def test_the_driver_branch_sets_the_cuda_major(driver: str, cuda: int | None) -> None:
    assert cuda_of_branch(branch_of(driver) or 0) == cuda


@pytest.mark.parametrize("labels,driver,cuda,source", [
    ({"nvidia.com/cuda.runtime-version.major": "13"}, None, 13, "label"),
    ({"nvidia.com/cuda.runtime.major": "12"}, None, 12, "label"),  # GFD's deprecated name
    ({"nvidia.com/cuda.driver-version.major": "580"}, None, 13, "driver label"),
    ({"nvidia.com/cuda.driver.major": "550"}, None, 12, "driver label"),
    # GFD's CUDA label wins over the history, which is older
    ({"nvidia.com/cuda.runtime-version.major": "12"}, "580.65.06", 12, "label"),
    ({}, "580.82.07", 13, "history"),
    ({}, None, None, ""),
    ({"nvidia.com/cuda.runtime-version.major": "x"}, "bad", None, ""),
])
def test_the_nodes_cuda_major_comes_from_gfd_then_history(labels: dict, driver: str | None, cuda: int | None,
                                                          source: str) -> None:
    assert node_cuda_major(labels, driver) == (cuda, source)


def rendered_image(cfg: Config, n: dict) -> str:
    ctx = ActionContext(config=cfg, node=n, run_id="sw-test-0001")
    job = render_job(ctx, "dcgm-diag.yaml.j2", 600, {"level": 1})
    return job["spec"]["template"]["spec"]["containers"][0]["image"]


def test_each_node_gets_the_build_its_driver_runs() -> None:
    assert rendered_image(CFG, node({"nvidia.com/cuda.runtime-version.major": "13"})) == IMG13
    assert rendered_image(CFG, node({"nvidia.com/cuda.driver-version.major": "570"})) == IMG12
    assert rendered_image(CFG, node(driver="580.65.06")) == IMG13  # no GFD: Sweeper's own last reading
    # nothing tells, or dcgm_images names no image for that major: dcgm_image
    assert rendered_image(CFG, node()) == CFG.dcgm_image
    assert rendered_image(CFG, node({"nvidia.com/cuda.runtime-version.major": "11"})) == CFG.dcgm_image
    assert rendered_image(Config(), node({"nvidia.com/cuda.runtime-version.major": "13"})) == Config().dcgm_image


def test_a_playbook_cannot_name_the_dcgm_image() -> None:
    ctx = ActionContext(config=CFG, node=node({"nvidia.com/cuda.runtime-version.major": "13"}), run_id="sw-t-2")
    with pytest.raises(Exception, match="dcgm_image"):
        render_job(ctx, "dcgm-diag.yaml.j2", 600, {"dcgm_image": "evil.example/x@sha256:" + "e" * 64})


def test_the_admission_policy_allows_every_dcgm_build() -> None:
    checks, _ = shapes(ROOT, CFG)
    assert {IMG12, IMG13, CFG.dcgm_image} <= checks.images


def test_lint_names_an_unpublished_dcgm_build(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"dcgm_images:\n  13: nvcr.io/nvidia/cloud-native/dcgm:4.4.2-1-ubuntu22.04@{UNPUBLISHED}\n")
    res = CliRunner().invoke(main, ["lint", "--config", str(path)])
    assert "dcgm_images.13:" in res.output and "unpublished placeholder" in res.output, res.output


# -- what dcgmi says when the image's build does not fit the driver -----------------------------

def test_a_missing_build_for_the_drivers_cuda_is_an_error_of_the_check_naming_dcgm_images() -> None:
    words = ("Error: Cannot load plugins. Unable to change to the plugin dir "
             "'/usr/libexec/datacenter-gpu-manager-4/plugins/cuda13/': 'No such file or directory'")
    r = dcgm.parse(json.dumps({"DCGM Diagnostic": {"runtime_error": words, "version": "4.4.2"}}), "n1", 0.0, 226)
    assert r.status == "error"
    (c,) = r.checks
    assert c.code == dcgm.CUDA_BUILD_CODE and "CUDA 13" in c.message and "dcgm_images" in c.message
    assert "not of the node" in c.message and "plugins/cuda13" in c.message
    # another runtime error keeps its own words, with no hint
    other = dcgm.parse(json.dumps({"DCGM Diagnostic": {"runtime_error": "The diagnostic is already running"}}),
                       "n1", 0.0, 217)
    assert other.status == "error" and other.checks[0].code == "exit 217" and "dcgm_images" not in other.checks[0].message


def test_a_cuda_runtime_newer_than_the_driver_is_an_error_not_a_gpu_failure() -> None:
    """A plugin's CUDA API call failing for the driver's age: DCGM_FR_CUDA_API (51, "Error using CUDA API
    %s", dcgmlib/dcgm_errors.h) with CUDA's words. Before, the test's Fail failed the node."""
    warning = {"error_category": 6, "error_id": 51, "error_severity": 2,
               "warning": "Error using CUDA API cudaGetDeviceCount: CUDA driver version is insufficient for CUDA "
                          "runtime version"}
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Integration", "tests": [{
        "name": "pcie", "test_summary": {"status": "Fail", "warnings": [warning]},
        "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Fail", "warnings": [warning]},
                    {"entity_group": "GPU", "entity_id": 1, "status": "Pass"}]}]}]}}
    r = dcgm.parse(json.dumps(doc), "n1", 0.0, 226)
    assert r.status == "error", r
    bad = [c for c in r.checks if c.status != "pass"]
    assert [(c.status, c.code, c.gpu) for c in bad] == [("error", dcgm.CUDA_BUILD_CODE, 0)]
    assert "dcgm_images" in bad[0].message


def test_the_table_form_says_the_same() -> None:
    table = """+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Integration  -------+------------------------------------------------|
| pcie                      | Fail                                           |
|                           | GPU0: Fail                                     |
| Warning: GPU0             | Error using CUDA API cuInit: system has unsupp |
|                           | orted display driver / cuda driver combination |
+---------------------------+------------------------------------------------+
"""
    r = dcgm.parse(table, "n1", 0.0, 226)
    assert r.status == "error", r
    assert {c.code for c in r.checks} == {dcgm.CUDA_BUILD_CODE}


def test_the_history_keeps_the_driver_the_node_check_last_read(tmp_path: Path) -> None:
    """The node check's `driver.version` (NVML's nvmlSystemGetDriverVersion) as it last passed; one it
    could not read is no reading."""
    from sweeper.history import History
    from sweeper.result import CheckResult, Result

    h = History(tmp_path / "h.db")
    try:
        assert h.driver_version("n1") is None
        h.run_started("r1", 1.0, "sweep")
        sid = h.sweep_started("r1", "n1", 1.0, "sweep-light.yaml", "p5")
        for ts, check in ((10.0, CheckResult("driver.version", "pass", "570.133.20")),
                          (20.0, CheckResult("driver.version", "pass", "580.65.06")),
                          (30.0, CheckResult("driver.version", "error", "cannot read the driver version: x"))):
            h.result(sid, Result("n1", "sweeper-check", ts, ts, (check,)))
        assert h.driver_version("n1") == "580.65.06"
        assert h.driver_version("n2") is None
    finally:
        h.close()
