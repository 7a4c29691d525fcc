"""The pair sweep's templates: a headless Service and an Indexed Job of two pods
(job-templates/nccl-pair.yaml.j2), or the same pair as an MPI Operator MPIJob
(job-templates/nccl-pair-mpijob.yaml.j2), each checked against the API it is written for.

Sources: the Indexed Job + headless Service pattern,
https://kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication/; the Job's completion
index, https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode; EFA in a pod
(`vpc.amazonaws.com/efa` with `hugepages-2Mi`), https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html;
AKS's InfiniBand as `rdma/ib`, https://azure.github.io/aks-rdma-infiniband/configurations/network-operator;
MPIJob v2beta1, https://github.com/kubeflow/mpi-operator/blob/master/pkg/apis/kubeflow/v2beta1/types.go."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sweeper.actions import ActionContext
from sweeper.actions.pair import mpijob_pods, render_pair
from sweeper.cli import main
from sweeper.config import Config
from sweeper.errors import PlaybookError
from sweeper.lint import K8S_VERSION
from sweeper.profiles import load_profile
from tests.k8s_schema import validate as k8s_validate

ROOT = Path(__file__).resolve().parent.parent
A, B = "ip-10-0-1-2.ec2.internal", "ip-10-0-1-3.ec2.internal"


def node(name: str, profile: str = "p5.48xlarge.yaml") -> dict[str, Any]:
    host = name.split(".")[0]
    return {"name": name, "gpus": 8, "annotations": {},
            "labels": {"kubernetes.io/hostname": host, "evil": "{{ 7*7 }}: [x]"},
            "profile": load_profile(ROOT / "profiles" / profile).as_vars()}


def rendered(template: str = "nccl-pair.yaml.j2", cfg: Config | None = None, profile: str = "p5.48xlarge.yaml",
             extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    ctx = ActionContext(config=cfg or Config(), node=node(A, profile), partner=node(B, profile), run_id="sw-1")
    return render_pair(ctx, template, 1800, extra or {})


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def test_the_pair_renders_a_headless_service_and_an_indexed_job_of_two() -> None:
    service, job, v = rendered()
    for doc in (service, job):
        k8s_validate(doc, K8S_VERSION, strict=True)
    name = v["job_name"]
    assert re.fullmatch(r"sweep-pair-ip-10-0-1-2-ec2-internal-[0-9a-f]{6}", name)
    assert len(f"{name}-1") <= 63, "each pod's hostname is a DNS label"
    assert service["metadata"]["name"] == name and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"sweeper.dev/pair": name}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == ("Indexed", 2, 2, 0)
    assert spec["activeDeadlineSeconds"] == 1800
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == name and "nodeName" not in pod
    labels = {"app.kubernetes.io/managed-by": "sweeper", "app.kubernetes.io/component": "pair",
              "sweeper.dev/run-id": "sw-1", "sweeper.dev/node": A, "sweeper.dev/partner": B, "sweeper.dev/pair": name}
    assert service["metadata"]["labels"] == job["metadata"]["labels"] == spec["template"]["metadata"]["labels"] == labels


def test_one_pod_on_each_node_through_the_scheduler() -> None:
    _, job, v = rendered()
    affinity = job["spec"]["template"]["spec"]["affinity"]
    term = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In",
                                         "values": ["ip-10-0-1-2", "ip-10-0-1-3"]}]
    (anti,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == {"labelSelector": {"matchLabels": {"sweeper.dev/pair": v["job_name"]}},
                    "topologyKey": "kubernetes.io/hostname"}
    tolerations = job["spec"]["template"]["spec"]["tolerations"]
    assert {"key": Config().taint_key, "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_the_pair_program_and_its_environment() -> None:
    _, job, v = rendered()
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "nccl" and c["command"] == ["pair-allreduce"]
    assert c["image"] == Config().pair_image and c["image"].startswith("ghcr.io/sweeper-dev/nccl-pair:25.01-py3@sha256:")
    env = env_of(c)
    name = v["job_name"]
    assert env["PAIR_RANK"] == {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert env["PAIR_MASTER"] == f"{name}-0.{name}"
    assert (env["PAIR_JOB"], env["PAIR_SERVICE"]) == (name, name)
    assert (env["PAIR_GPUS"], env["PAIR_MTU"], env["PAIR_IFACES"]) == ("8", "9001", "eth0")
    assert (env["PAIR_RDZV_TIMEOUT"], env["PAIR_MAX_BYTES"]) == ("600", "8G")
    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
    assert env["NCCL_DEBUG"] == "WARN"
    env = env_of(rendered(extra={"pair_rdzv_timeout": 120, "pair_max_bytes": "1G"})[1]["spec"]["template"]["spec"]
                 ["containers"][0])
    assert (env["PAIR_RDZV_TIMEOUT"], env["PAIR_MAX_BYTES"]) == ("120", "1G")


@pytest.mark.parametrize("profile,fabric", [
    ("p5.48xlarge.yaml", {"vpc.amazonaws.com/efa": "32", "hugepages-2Mi": "5120Mi"}),
    ("p5en.48xlarge.yaml", {"vpc.amazonaws.com/efa": "16", "hugepages-2Mi": "5120Mi"}),
    ("azure-nd-h100-v5.yaml", {"rdma/ib": "8"}),
    ("gcp-a3-megagpu-8g.yaml", {}),
])
def test_each_pod_takes_every_gpu_and_the_profiles_fabric_devices(profile: str, fabric: dict[str, str]) -> None:
    _, job, _ = rendered(profile=profile)
    k8s_validate(job, K8S_VERSION, strict=True)
    res = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    for kind in ("requests", "limits"):
        extended = {k: v for k, v in res[kind].items() if k not in ("cpu", "memory")}
        assert extended == {"nvidia.com/gpu": "8", **fabric}, kind
    env = env_of(job["spec"]["template"]["spec"]["containers"][0])
    assert ("FI_PROVIDER" in env) == ("vpc.amazonaws.com/efa" in fabric)


def test_the_pair_pods_take_least_privilege() -> None:
    pod = rendered()[1]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any("hostPath" in v for v in pod["volumes"])


@pytest.mark.parametrize("edit,words", [
    (("      affinity: {{ pair_affinity | tojson }}", "      nodeName: {{ node.name | tojson }}\n      affinity: "
      "{{ pair_affinity | tojson }}"), "nodeName bypasses"),
    (("      affinity: {{ pair_affinity | tojson }}", "      affinity: {}"), "pair affinity"),
    (("{%- for k, v in fabric_resources | dictsort %}", "{%- for k, v in {} | dictsort %}"), "fabric devices"),
    (("  completionMode: Indexed\n", ""), "Indexed"),
    (("      subdomain: {{ service_name | tojson }}\n", ""), "subdomain"),
    (("  clusterIP: None\n", ""), "headless"),
])
def test_an_unsafe_pair_template_is_refused_and_lint_says_where(tmp_path: Path, edit: tuple[str, str],
                                                                 words: str) -> None:
    text = (ROOT / "job-templates" / "nccl-pair.yaml.j2").read_text()
    assert edit[0] in text
    (tmp_path / "nccl-pair.yaml.j2").write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(PlaybookError, match=words):
        rendered(cfg=Config(template_dir=str(tmp_path)))
    res = CliRunner().invoke(main, ["lint", str(tmp_path / "nccl-pair.yaml.j2")])
    assert res.exit_code == 1 and f"{tmp_path / 'nccl-pair.yaml.j2'}:1:" in res.output and words in res.output


def test_the_mpijob_is_the_mpi_operators_v2beta1() -> None:
    """One document: the operator makes the Workers' headless Service (<name>-worker), the hostfile
    and the SSH keys itself (pkg/controller/mpi_job_controller.go: newWorkersService, newConfigMap,
    newSSHAuthSecret), so the template renders no Service of its own."""
    service, job, v = rendered("nccl-pair-mpijob.yaml.j2")
    assert service is None
    assert job["metadata"]["labels"]["sweeper.dev/run-id"] == "sw-1", "reconcile finds a dead run's MPIJob by it"
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["sshAuthMountPath"] == "/opt/nccl-pair/.ssh"
    assert spec["mpiImplementation"] == "OpenMPI" and spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 1800 and spec["runPolicy"]["backoffLimit"] == 0
    assert {k: r["replicas"] for k, r in spec["mpiReplicaSpecs"].items()} == {"Launcher": 1, "Worker": 2}
    name = job["metadata"]["name"]
    assert len(f"{name}-worker-1") <= 63 and name != v["service_name"], "the operator's own Service takes its name"
    launcher, worker = mpijob_pods(job)
    for pod in (launcher, worker):
        k8s_validate(pod, K8S_VERSION, strict=True)
    assert worker["spec"]["affinity"] == v["pair_affinity"]
    assert "sweeper.dev/pair" not in launcher["metadata"]["labels"], "the Workers' anti-affinity is theirs alone"
    limits = worker["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["nvidia.com/gpu"], limits["vpc.amazonaws.com/efa"]) == ("8", "32")
    args = launcher["spec"]["containers"][0]["args"]
    assert args[args.index("-np") + 1] == "16" and "ppr:8:node" in args
    # the operator's worker DNS name: <name>-worker-<i>.<name>-worker.<namespace>.svc (its hostfile's)
    assert f"MASTER_ADDR={name}-worker-0.{name}-worker.sweeper-checks.svc" in args
    assert not {k for k in launcher["spec"]["containers"][0]["resources"]["requests"] if "/" in k}, \
        "the launcher requests no GPU or fabric device"


@pytest.mark.parametrize("edit,words", [
    (("              resources:\n                requests: {cpu: 500m, memory: 512Mi}",
      "              resources:\n                requests: {cpu: 500m, memory: 512Mi, nvidia.com/gpu: 1}"),
     "Launcher: the launcher only runs mpirun"),
    (("          affinity: {{ pair_affinity | tojson }}", "          affinity: {}"), "pair affinity"),
    (("  labels: {{ labels | tojson }}\nspec:", "spec:"), "reconcile"),
])
def test_an_unsafe_mpijob_is_refused(tmp_path: Path, edit: tuple[str, str], words: str) -> None:
    text = (ROOT / "job-templates" / "nccl-pair-mpijob.yaml.j2").read_text()
    assert edit[0] in text
    (tmp_path / "nccl-pair-mpijob.yaml.j2").write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(PlaybookError, match=words):
        rendered("nccl-pair-mpijob.yaml.j2", cfg=Config(template_dir=str(tmp_path)))


def test_lint_accepts_both_pair_templates(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["lint", str(ROOT / "job-templates" / "nccl-pair.yaml.j2"),
                                    str(ROOT / "job-templates" / "nccl-pair-mpijob.yaml.j2")])
    assert res.exit_code == 0, res.output
    text = (ROOT / "job-templates" / "nccl-pair-mpijob.yaml.j2").read_text()
    shutil.copy(ROOT / "job-templates" / "nccl-pair-mpijob.yaml.j2", tmp_path / "m.yaml.j2")
    (tmp_path / "m.yaml.j2").write_text(text.replace("slotsPerWorker: {{ node.gpus }}", "slotsPerWorker: many"))
    res = CliRunner().invoke(main, ["lint", str(tmp_path / "m.yaml.j2")])
    assert res.exit_code == 1 and "slotsPerWorker" in res.output
