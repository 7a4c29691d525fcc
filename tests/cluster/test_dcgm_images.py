"""Each node's DCGM Job runs the build of the CUDA major its driver runs (config `dcgm_images`), on the
simulated cluster: its kubelet runs `dcgmi diag` from an image with only some of DCGM's builds as DCGM
does, loading the plugins of plugins/cuda<the driver's CUDA major>/ and failing without them
(NVIDIA/DCGM: nvvs/include/TestFramework.inl, GetPluginCudaDirExtension and LoadPluginWithDir). A driver
of branch 580 or later runs CUDA 13, of 525 or later CUDA 12 (https://docs.nvidia.com/deploy/cuda-compatibility/);
GPU feature discovery labels it (NVIDIA/k8s-device-plugin: internal/lm/nvml.go)."""

from __future__ import annotations

from dataclasses import replace

from sweeper.history import History
from sweeper.parsers.dcgm import CUDA_BUILD_CODE
from sweeper.policy import HOLDING
from tests.conftest import TEST_CONFIG, Sim, run_sweep

IMG12 = "nvcr.io/nvidia/cloud-native/dcgm:4.4.2-1-cuda12@sha256:" + "1" * 64
IMG13 = "nvcr.io/nvidia/cloud-native/dcgm:4.4.2-1-cuda13@sha256:" + "3" * 64
# One image for every node, as before dcgm_images: a DCGM 4.4 image with its CUDA 12 build only.
CFG = replace(TEST_CONFIG, playbook="sweep-dcgm.yaml", interval=0, check_timeout=1800, dcgm_hostengine="",
              dcgm_level=1, dcgm_image=IMG12)


def fleet(operator_c: bool = True) -> dict:
    group = {"count": 1, "instance_type": "p5.48xlarge", "age": "2d"}
    # At 120x, not the usual 600x: DCGM level 1's Job deadline (5 simulated minutes) is 2.5 s of real time
    # rather than 0.5 s, which a loaded machine once spent before the pod started ("the check pod never
    # started before its deadline", the node inconclusive where the test expects its pass).
    return {"name": "drivers", "seed": 3, "speed": 120, "faults": {}, "workloads": [],
            "node_groups": [{**group, "name_prefix": "r580-", "driver": "580.65.06"},
                            {**group, "name_prefix": "r570-", "driver": "570.133.20"},
                            {**group, "name_prefix": "nogfd-", "driver": "580.82.07", "gpu_operator": operator_c}],
            # Each image carries one DCGM build.
            "registry": {"cuda_builds": {IMG12: [12], IMG13: [13]}}}


def dcgm_pods(sim: Sim) -> list[dict]:
    """Every DCGM pod of the run, as it was when its Job was cleaned up."""
    pods: list[dict] = []
    sim.cluster.store.on_delete.append(
        lambda plural, obj: pods.append(obj) if plural == "pods" and obj["spec"]["containers"][0]["name"] == "dcgm"
        else None)
    return pods


def images_by_node(pods: list[dict]) -> dict[str, str]:
    return {p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"] for p in pods}


def verdicts(report) -> dict[str, str]:
    return {o.node: o.verdict for o in report.outcomes}


def dcgm_codes(history: History, node: str) -> set[str | None]:
    return {r["code"] for r in history.db.query("select code from checks where node = ? and source = 'dcgm'",
                                                [node])}


def test_gfd_labels_the_simulated_nodes_with_their_driver_and_cuda(make_sim) -> None:
    sim: Sim = make_sim(fleet(operator_c=False))
    labels = sim.core.read_node("r580-00").metadata.labels
    assert (labels["nvidia.com/cuda.driver-version.full"], labels["nvidia.com/cuda.driver-version.major"],
            labels["nvidia.com/cuda.runtime-version.major"]) == ("580.65.06", "580", "13")
    assert sim.core.read_node("r570-00").metadata.labels["nvidia.com/cuda.runtime-version.major"] == "12"
    assert "nvidia.com/cuda.runtime-version.major" not in sim.core.read_node("nogfd-00").metadata.labels


def test_each_dcgm_job_runs_the_build_its_nodes_driver_runs(make_sim, history: History) -> None:
    """One image for every node: the CUDA 12 build cannot run on the 580 drivers, and that is the check's
    fault (error, released, nothing held against the node). dcgm_images gives each its build: the GFD
    nodes at once, the node without GFD once its own check has recorded its driver."""
    sim: Sim = make_sim(fleet(operator_c=False))
    pods = dcgm_pods(sim)
    report = run_sweep(sim, history, replace(CFG, tool_error_limit=0))
    assert set(images_by_node(pods).values()) == {IMG12}
    assert verdicts(report) == {"r580-00": "error", "r570-00": "pass", "nogfd-00": "error"}
    for node in ("r580-00", "nogfd-00"):
        assert dcgm_codes(history, node) == {CUDA_BUILD_CODE}
        reasons = "; ".join(next(o for o in report.outcomes if o.node == node).reasons)
        assert "dcgm_images" in reasons and "CUDA 13" in reasons, reasons
        assert not sim.core.read_node(node).spec.taints, "handed back"
    assert history.failures_since(0, HOLDING) == {}

    # CUDA 12's build stays dcgm_image, the default where dcgm_images names no image
    pods = dcgm_pods(sim)
    report = run_sweep(sim, history, replace(CFG, dcgm_images={13: IMG13}))
    assert images_by_node(pods) == {"r580-00": IMG13, "r570-00": IMG12, "nogfd-00": IMG13}
    # nogfd-00 has no labels; its node check of the first sweep read driver 580.82.07 through NVML
    assert history.driver_version("nogfd-00") == "580.82.07"
    assert verdicts(report) == {"r580-00": "pass", "r570-00": "pass", "nogfd-00": "pass"}, \
        [(o.node, o.reasons) for o in report.outcomes]


def test_a_build_for_the_wrong_major_fails_the_check_not_the_node(make_sim, history: History) -> None:
    """The mapping the other way round: each node gets the other major's build, and each ends error."""
    sim: Sim = make_sim(fleet())
    report = run_sweep(sim, history, replace(CFG, dcgm_images={12: IMG13, 13: IMG12}, tool_error_limit=0))
    assert set(verdicts(report).values()) == {"error"}
    assert dcgm_codes(history, "r570-00") == {CUDA_BUILD_CODE}
    assert history.failures_since(0, HOLDING) == {}
