"""The check Jobs on each platform: where the GPU libraries come from (runtime class, GKE's driver
directory), which DCGM host engine a diagnostic talks to and at which level, NCCL's /dev/shm, and
the keys that choose them, checked when the config, a profile or a schedule is read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sweeper.actions import ActionContext
from sweeper.actions.jobs import render_job
from sweeper.config import Config, load_config
from sweeper.errors import ConfigError
from sweeper.profiles import load_profile

ROOT = Path(__file__).resolve().parent.parent
GPU_JOBS = ("sweeper-check.yaml.j2", "sweeper-light.yaml.j2", "dcgm-diag.yaml.j2", "nccl-allreduce.yaml.j2",
            "gpu-reset.yaml.j2")


def node(profile: str = "p5.48xlarge.yaml", **profile_keys: Any) -> dict[str, Any]:
    vars_ = load_profile(ROOT / "profiles" / profile).as_vars() | profile_keys
    return {"name": "gpu-1", "gpus": 8, "labels": {"kubernetes.io/hostname": "gpu-1"}, "annotations": {},
            "profile": vars_}


def pod_of(template: str, cfg: Config, extra: dict[str, Any] | None = None, **profile_keys: Any) -> dict[str, Any]:
    job = render_job(ActionContext(config=cfg, node=node(**profile_keys), run_id="sw-1"), template, 900, extra or {},
                     remediation=template == "gpu-reset.yaml.j2", bound=template == "gpu-reset.yaml.j2")  # as the remediation renders it
    return job["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0].get("env") or []}


@pytest.mark.parametrize("template", GPU_JOBS)
def test_the_runtime_class_follows_the_platform_and_the_key(template: str) -> None:
    """The GPU Operator registers NVIDIA's runtime as RuntimeClass `nvidia`
    (https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html); the
    EKS and AKS GPU images make it containerd's default and GKE has none, so naming one there would
    have every check pod refused at admission (https://kubernetes.io/docs/concepts/containers/runtime-class/)."""
    assert pod_of(template, Config())["runtimeClassName"] == "nvidia"
    for platform in ("eks", "aks", "gke"):
        assert "runtimeClassName" not in pod_of(template, Config(platform=platform))
    assert "runtimeClassName" not in pod_of(template, Config(runtime_class=""))
    assert pod_of(template, Config(platform="eks", runtime_class="nvidia-cdi"))["runtimeClassName"] == "nvidia-cdi"


@pytest.mark.parametrize("template", GPU_JOBS)
def test_on_gke_the_jobs_find_the_driver_where_gke_puts_it(template: str) -> None:
    """GKE installs the driver under /home/kubernetes/bin/nvidia and its device plugin mounts it at
    /usr/local/nvidia only in pods that request GPUs; CUDA and NVML are found through
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64 (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus)."""
    pod = pod_of(template, Config(platform="gke"))
    assert env_of(pod)["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    driver = [v for v in pod.get("volumes") or [] if (v.get("hostPath") or {}).get("path") == "/home/kubernetes/bin/nvidia"]
    if template in ("sweeper-light.yaml.j2", "gpu-reset.yaml.j2"):  # no GPU request: no device plugin to mount it
        assert driver and {"name": driver[0]["name"], "mountPath": "/usr/local/nvidia", "readOnly": True,
                           "recursiveReadOnly": "Enabled"} in \
            pod["containers"][0]["volumeMounts"]
        if template == "sweeper-light.yaml.j2":
            assert pod["containers"][0]["args"][pod["containers"][0]["args"].index("--gpu-request") + 1] == "none"
    else:
        assert not driver, "a pod that requests GPUs gets the driver from GKE's device plugin"
    assert "LD_LIBRARY_PATH" not in env_of(pod_of(template, Config(platform="eks")))


def test_dcgm_talks_to_the_nodes_own_host_engine_or_starts_one() -> None:
    """One host engine per node: the GPU Operator's standalone nv-hostengine listens on the node's
    port 5555 (a hostPort), reached through the node's own address (status.hostIP), never a Service,
    which would pick any node's engine. Without one, nv-hostengine daemonizes once it listens on
    127.0.0.1:5555 in the pod and dcgmi runs through it
    (https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/nv-hostengine.html)."""
    c = pod_of("dcgm-diag.yaml.j2", Config())["containers"][0]
    assert c["command"] == ["sh", "-c", "nv-hostengine && exec dcgmi diag -r 2 -j"]
    c = pod_of("dcgm-diag.yaml.j2", Config(dcgm_hostengine="node"))["containers"][0]
    assert c["command"] == ["dcgmi", "diag", "--host", "$(NODE_IP):5555", "-r", "2", "-j"]
    assert env_of({"containers": [c]})["NODE_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    c = pod_of("dcgm-diag.yaml.j2", Config(dcgm_hostengine="node:5556"))["containers"][0]
    assert c["command"][3] == "$(NODE_IP):5556"
    c = pod_of("dcgm-diag.yaml.j2", Config(dcgm_hostengine="10.0.0.7:5555"))["containers"][0]
    assert c["command"][:4] == ["dcgmi", "diag", "--host", "10.0.0.7:5555"]


def test_the_dcgm_level_comes_from_the_task_the_config_or_the_profile() -> None:
    def level(cfg: Config, extra: dict[str, Any] | None = None, **profile_keys: Any) -> str:
        cmd = pod_of("dcgm-diag.yaml.j2", cfg, extra, **profile_keys)["containers"][0]["command"]
        return str(cmd[-1].split("-r ")[1].split()[0] if cmd[0] == "sh" else cmd[cmd.index("-r") + 1])
    assert level(Config()) == "2"
    assert level(Config(), dcgm_level=3) == "3", "the profile's"
    assert level(Config(dcgm_level=1), dcgm_level=3) == "1", "the config's (or its schedule's) over the profile's"
    assert level(Config(dcgm_level=1), {"level": "4"}, dcgm_level=3) == "4", "the task's over both"


def test_nccl_gets_a_memory_backed_dev_shm_and_warnings() -> None:
    """NCCL's shared memory lives in /dev/shm, 64 MiB in a container unless a memory-backed emptyDir
    replaces it (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html,
    https://kubernetes.io/docs/concepts/storage/volumes/#emptydir); NCCL_DEBUG=WARN says why a
    transport fell back (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)."""
    pod = pod_of("nccl-allreduce.yaml.j2", Config())
    (shm,) = [v for v in pod["volumes"] if "emptyDir" in v]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert {"name": shm["name"], "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    assert env_of(pod)["NCCL_DEBUG"] == "WARN"
    assert pod["containers"][0]["image"] == Config().nccl_image
    assert pod["containers"][0]["image"].startswith("ghcr.io/sweeper-dev/nccl-tests:2.19.6-cuda12.8@sha256:")
    pod = pod_of("nccl-allreduce.yaml.j2", Config(), {"nccl_shm_size": "4Gi"})
    assert [v for v in pod["volumes"] if "emptyDir" in v][0]["emptyDir"]["sizeLimit"] == "4Gi"


@pytest.mark.parametrize("text,expected", [
    ("dcgm_level: 5", "dcgm_level: 5 is too large; allowed: integer >= 1 and <= 4 or empty"),
    ("dcgm_level: 0", "dcgm_level: 0 is too small; allowed: integer >= 1 and <= 4 or empty"),
    ("platform: openshift", "platform: openshift is not one of the choices; allowed: one of auto, generic, eks, aks, gke"),
    ("dcgm_hostengine: nvidia-dcgm.gpu-operator", "dcgm_hostengine: nvidia-dcgm.gpu-operator does not match"),
    ("runtime_class: Nvidia", "runtime_class: Nvidia does not match"),
    ("schedules: [{name: deep, cron: '0 3 * * 0', dcgm_level: 7}]", "schedules[0].dcgm_level: 7 is too large"),
])
def test_platform_keys_are_checked_when_the_config_is_read(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"namespace: sweeper\n{text}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value).startswith(f"{path}:2: {expected}"), str(exc.value)


def test_a_profiles_dcgm_level_is_checked_when_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("gpus: 8\ndcgm_level: 9\n")
    with pytest.raises(ConfigError) as exc:
        load_profile(path)
    assert f"{path}:2: dcgm_level: 9 is too large" in str(exc.value)
    path.write_text("gpus: 8\ndcgm_level: 3\n")
    assert load_profile(path).dcgm_level == 3


def test_a_second_host_engine_beside_dcgm_exporter_is_said() -> None:
    """dcgm-exporter starts an embedded nv-hostengine unless told to use a running one
    (https://docs.nvidia.com/datacenter/cloud-native/gpu-telemetry/latest/dcgm-exporter.html): a Job
    that starts its own on a GPU Operator node runs a second engine there, and the sweep's log says so."""
    said: list[str] = []
    gpu_node = node() | {"labels": {"kubernetes.io/hostname": "gpu-1", "nvidia.com/gpu.deploy.dcgm-exporter": "true"}}
    for cfg in (Config(), Config(dcgm_hostengine="node")):
        render_job(ActionContext(config=cfg, node=gpu_node, run_id="sw-1", log=said.append), "dcgm-diag.yaml.j2",
                   900, {})
    assert len(said) == 1 and "second DCGM host engine" in said[0] and "dcgm_hostengine: node" in said[0]
    render_job(ActionContext(config=Config(), node=node(), run_id="sw-1", log=said.append), "dcgm-diag.yaml.j2",
               900, {})
    assert len(said) == 1, "no dcgm-exporter on the node: nothing to say"


def test_a_schedules_dcgm_level_is_the_level_of_its_runs(tmp_path: Path) -> None:
    """`sweeper serve` gives each schedule its own config: a schedule's dcgm_level is its runs'."""
    from sweeper.serve import Server

    path = tmp_path / "config.yaml"
    path.write_text("schedules:\n  - {name: deep, cron: '0 3 * * 0', playbook: sweep-dcgm.yaml, dcgm_level: 3}\n"
                    "  - {name: light, cron: '*/30 * * * *'}\n")
    server = Server(load_config(path), None, None, port=0, host="127.0.0.1")
    try:
        runs = {job.id: job.args[1] for job in server.scheduler.get_jobs()}
    finally:
        server.httpd.server_close()
    assert {k: cfg.dcgm_level for k, cfg in runs.items()} == {"deep": 3, "light": None}
    assert runs["deep"].dcgm_level_for(node(dcgm_level=2)) == 3, "over the profile's"
    assert runs["light"].dcgm_level_for(node(dcgm_level=2)) == 2


def test_a_reset_template_that_asks_for_a_gpu_or_goes_through_the_scheduler_is_refused(tmp_path: Any) -> None:
    """While the device plugin is paused the kubelet counts none of the node's GPUs allocatable
    (kubernetes/kubernetes, pkg/kubelet/cm/devicemanager/manager.go, markResourceUnhealthy): a reset
    pod that requests one never starts, and one sent through the scheduler never lands. Lint and
    the remediation both refuse such a template."""
    import shutil

    from sweeper.errors import PlaybookError
    from sweeper.lint import lint_template

    shutil.copytree(ROOT / "job-templates", tmp_path / "t")
    path = tmp_path / "t" / "gpu-reset.yaml.j2"
    shipped = path.read_text()
    cfg = Config(template_dir=str(tmp_path / "t"))
    assert lint_template(ROOT / "job-templates" / "gpu-reset.yaml.j2", Config()) == []
    path.write_text(shipped.replace("              cpu: 500m\n", "              cpu: 500m\n              nvidia.com/gpu: 8\n"))
    with pytest.raises(PlaybookError, match="requests no GPU"):
        render_job(ActionContext(config=cfg, node=node(), run_id="sw-1"), "gpu-reset.yaml.j2", 900, {}, bound=True)
    assert any("requests no GPU" in p for p in lint_template(path, cfg))
    path.write_text(shipped.replace("nodeName: {{ node.name | tojson }}", "affinity: {{ affinity | tojson }}"))
    assert any("bound to its node" in p for p in lint_template(path, cfg))
