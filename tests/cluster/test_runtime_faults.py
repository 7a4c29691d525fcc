"""A container that cannot start because of the node's own GPU stack (NVIDIA's container hook, NVML,
CDI, the driver) is a finding on the node, never a fault of the check (issue 21, point 3).

What the runtime says comes from the field: a GPU Operator node after a driver update reports its
pods' containers as terminated, reason StartError, exit code 128, with the message "failed to
create containerd task: ... error running hook #0: error running hook: exit status 1, stdout: ,
stderr: Auto-detected mode as 'legacy'\\nnvidia-container-cli: initialization error: nvml error:
driver/library version mismatch: unknown" (https://github.com/NVIDIA/gpu-operator/issues/898; the
same words with the device plugin's image in https://github.com/NVIDIA/k8s-device-plugin/issues/1431).
"detection error: nvml error: ..." is NVML failing to enumerate the GPUs
(https://github.com/NVIDIA/nvidia-container-toolkit/issues/416); CDI mode fails with "failed to
inject CDI devices: unresolvable CDI devices ..." when the node's CDI spec lacks them
(https://github.com/NVIDIA/nvidia-container-toolkit/issues/1239)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sweeper.actions.jobs import gpu_stack_words
from sweeper.history import History
from sweeper.sim.cluster import HOOK_FAILED
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

MISMATCH = "nvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown"
CDI = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: could not apply "
       "required modification to OCI specification: error modifying OCI spec: failed to inject CDI devices: "
       "unresolvable CDI devices nvidia.com/gpu=all: unknown")
CFG = replace(TEST_CONFIG, check_timeout=1800, light_playbook="")


@pytest.mark.parametrize("words", [
    HOOK_FAILED + MISMATCH,
    HOOK_FAILED + "nvidia-container-cli: detection error: nvml error: unknown error: unknown",
    HOOK_FAILED + "nvidia-container-cli: detection error: nvml error: GPU is lost: unknown",
    CDI])
def test_the_runtime_words_that_name_the_gpu_stack(words: str) -> None:
    assert gpu_stack_words(words)
    assert "Auto-detected mode" not in gpu_stack_words(words), "the line that names the stack, not the hook's chatter"


@pytest.mark.parametrize("words", [
    'failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: '
    'unable to start container process: exec: "sweeper": executable file not found in $PATH: unknown',
    'rpc error: code = NotFound desc = failed to pull and unpack image "ghcr.io/x/y:1": not found',
    # the image asks for a newer CUDA than the driver: the image is the check's to fix
    HOOK_FAILED + "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update "
                  "your driver to a newer version, or use an earlier cuda container: unknown",
    ""])
def test_a_tool_reason_stays_a_fault_of_the_check(words: str) -> None:
    assert gpu_stack_words(words) == ""


def test_three_nodes_with_a_driver_library_mismatch_are_held_and_the_run_goes_on(make_sim,
                                                                                   history: History) -> None:
    """Before, each of the three ended `error` as check.tool, the third stopped the run (exit 5)
    and the nodes went back into service with a broken driver."""
    broken = ("gpu-01", "gpu-03", "gpu-05")
    sim: Sim = make_sim(fleet_spec(nodes=6, faults={n: {"runtime_error": MISMATCH} for n in broken}))
    report = run_sweep(sim, history, CFG)
    assert report.tool_stop == "" and report.tool_errors == {}
    outcomes = {o.node: o for o in report.outcomes}
    assert len(outcomes) == 6, "the run went on to every node"
    for n in broken:
        o = outcomes[n]
        assert (o.verdict, o.action) == ("reboot", "held"), o
        assert any(r.startswith("gpu.runtime: the container runtime could not start the check (StartError, exit 128)")
                   and MISMATCH in r for r in o.reasons), o.reasons
    for n in ("gpu-00", "gpu-02", "gpu-04"):
        assert outcomes[n].verdict == "pass", outcomes[n]
    rows = list(history.db.query("select node, name, status, code from checks where name = 'gpu.runtime'"))
    assert sorted(r["node"] for r in rows) == list(broken)
    assert {(r["status"], r["code"]) for r in rows} == {("fail", "GPU_RUNTIME")}
    # every container that asks for GPUs fails there, not only Sweeper's: a training pod too
    pod = sim.cluster.start_training(8, 3600, node="gpu-00")
    sim.core.delete_namespaced_pod(pod["metadata"]["name"], "training")
    pod = sim.cluster.start_training(8, 3600, node="gpu-05")
    state = sim.wait_for(lambda: (sim.core.read_namespaced_pod(pod["metadata"]["name"], "training").status
                                  .container_statuses or [None])[0], what="the training pod's status")
    assert (state.state.terminated.reason, state.state.terminated.exit_code) == ("StartError", 128)
    assert state.state.terminated.message.endswith(MISMATCH)


def test_cdi_devices_that_do_not_resolve_are_the_nodes(make_sim, history: History) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=2, faults={"gpu-01": {"runtime_error": CDI}}))
    report = run_sweep(sim, history, CFG)
    o = next(o for o in report.outcomes if o.node == "gpu-01")
    assert (o.verdict, o.action) == ("reboot", "held") and report.tool_errors == {}
    assert any("unresolvable CDI devices nvidia.com/gpu=all" in r for r in o.reasons), o.reasons


def test_the_probe_after_a_stop_is_never_a_suspect(make_sim, history: History) -> None:
    """The last run stopped on a fault of the check. The next run tries one node first; a suspect
    (here one whose device plugin holds a GPU back) failing would say nothing about the check, and
    before, it was the first node taken (suspects first), so sweeping never resumed."""
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={"gpu-02": {"gpu_lost": [1]}}))
    history.run_started("sw-stopped", sim.cluster.clock.now() - 600, "sweep")
    history.run_finished("sw-stopped", sim.cluster.clock.now() - 500, "done", 3,
                         {"tool_stop": "run stopped: the same fault of the check ended 3 nodes"})
    report = run_sweep(sim, history, replace(CFG, max_nodes=4))
    taken = [o.node for o in report.outcomes if o.action != "skipped"]
    assert taken and taken[0] != "gpu-02", report.outcomes
    assert report.tool_stop == "", "the probe passed: the rest were swept"
    assert {o.node for o in report.outcomes if o.verdict} == {"gpu-00", "gpu-01", "gpu-02", "gpu-03"}


def test_a_waiting_container_the_gpu_stack_refuses_is_the_nodes() -> None:
    """containerd injects CDI devices when it creates the container: the kubelet then waits with
    CreateContainerError ("failed to create containerd container: CDI device injection failed:
    unresolvable CDI devices ...", https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/issues/736);
    a CreateContainerError of another kind stays the check's."""
    from sweeper.actions.jobs import _Fault

    def pod(message: str) -> dict:
        return {"spec": {"nodeName": "gpu-07"}, "status": {"containerStatuses": [{"image": "x", "state": {
            "waiting": {"reason": "CreateContainerError", "message": message}}}]}}

    fault = _Fault()
    fault.see([pod("failed to create containerd container: CDI device injection failed: unresolvable CDI "
                   "devices nvidia.com/gpu=GPU-1")], 0.0)
    [check] = fault.result("gpu-07", 1.0).checks
    assert (check.name, check.status, check.code) == ("gpu.runtime", "fail", "GPU_RUNTIME")
    assert "unresolvable CDI devices nvidia.com/gpu=GPU-1" in check.message
    fault = _Fault()
    fault.see([pod('failed to create containerd container: error: stat /data/x: no such file or directory')], 0.0)
    [check] = fault.result("gpu-07", 1.0).checks
    assert (check.name, check.status) == ("check.tool", "error")


def test_a_pair_pod_the_gpu_stack_cannot_start_is_pinned_on_its_node_by_re_pairing(make_sim,
                                                                                       history: History) -> None:
    """In a pair sweep the finding names the node whose runtime refused the pod; re-pairing with
    known-good partners holds that node alone. Before: `check.tool`, both handed back."""
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={"gpu-00": {"runtime_error": MISMATCH}}))
    report = run_sweep(sim, history, replace(CFG, playbook="pair-fabric.yaml"))
    assert report.tool_stop == "" and report.tool_errors == {}
    last = {o.node: o for o in report.outcomes}
    assert (last["gpu-00"].verdict, last["gpu-00"].action) == ("reboot", "held"), report.outcomes
    assert all(o.action != "held" for n, o in last.items() if n != "gpu-00"), report.outcomes
    assert any(MISMATCH in r for r in last["gpu-00"].reasons), last["gpu-00"].reasons


def test_with_only_suspects_due_the_stop_stands_until_one_that_is_not_can_be_tried(make_sim,
                                                                                     history: History) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=2, faults={"gpu-00": {"gpu_lost": [1]}, "gpu-01": {"gpu_lost": [2]}}))
    stop = "run stopped: the same fault of the check ended 3 nodes"
    history.run_started("sw-stopped", sim.cluster.clock.now() - 600, "sweep")
    history.run_finished("sw-stopped", sim.cluster.clock.now() - 500, "done", 3, {"tool_stop": stop})
    report = run_sweep(sim, history, CFG)
    assert report.outcomes == [] and report.tool_stop == stop
