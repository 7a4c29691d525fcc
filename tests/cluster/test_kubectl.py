"""kubectl against `sweeper sim serve`: the simulated cluster must look like a real one."""

from __future__ import annotations

import glob
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def find_kubectl() -> str | None:
    found = shutil.which("kubectl")
    if found:
        return found
    for pattern in ("/usr/lib/google-cloud-sdk/bin/kubectl", "/usr/lib/google-cloud-sdk/bin/kubectl.1.*",
                    os.path.expanduser("~/google-cloud-sdk/bin/kubectl")):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


KUBECTL = find_kubectl()
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl not found on PATH or in the Google Cloud SDK; "
                                                        "install kubectl to run the kubectl compatibility tests")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("kubectl")
    kc = tmp / "kubeconfig"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "sim", "serve", "--port", str(port),
                             "--kubeconfig-out", str(kc)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if kc.exists():
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                pass
        if proc.poll() is not None:
            raise AssertionError("sim serve exited: " + proc.stdout.read().decode())  # type: ignore[union-attr]
        time.sleep(0.05)
    else:
        proc.kill()
        raise AssertionError("sim serve did not start")
    yield kc
    proc.terminate()
    assert proc.wait(timeout=10) == 0, "sim serve stops cleanly on SIGTERM"


def kubectl(kc: Path, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(kc), "HOME": str(kc.parent)}
    proc = subprocess.run([KUBECTL, *args], capture_output=True, text=True, env=env, timeout=60)  # type: ignore[list-item]
    assert proc.returncode == 0, f"kubectl {' '.join(args)} failed: {proc.stderr}"
    return proc.stdout


def test_get_nodes(served: Path) -> None:
    out = kubectl(served, "get", "nodes")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert len(lines) == 17 and "gpu-p5-00" in out and "Ready" in out
    sel = kubectl(served, "get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "name")
    assert sel.split()[0] == "node/gpu-p5-00" and len(sel.split()) == 16


def test_get_pods_all_namespaces(served: Path) -> None:
    out = kubectl(served, "get", "pods", "-A", "-o", "wide")
    header = out.splitlines()[0].split()
    assert header[:3] == ["NAMESPACE", "NAME", "READY"] and "NODE" in header
    assert "training" in out and "gpu-p5-02" in out


def test_describe_node(served: Path) -> None:
    out = kubectl(served, "describe", "node", "gpu-p5-02")
    assert "Name:               gpu-p5-02" in out
    assert "node.kubernetes.io/instance-type=p5.48xlarge" in out
    assert "nvidia.com/gpu:" in out and "aws:///us-east-1a/i-0" in out
    assert "Non-terminated Pods:" in out and "training" in out


def test_taint_and_cordon(served: Path) -> None:
    assert "tainted" in kubectl(served, "taint", "node", "gpu-p5-07", "example.com/maint=yes:NoSchedule")
    out = kubectl(served, "describe", "node", "gpu-p5-07")
    assert "example.com/maint=yes:NoSchedule" in out
    assert "untainted" in kubectl(served, "taint", "node", "gpu-p5-07", "example.com/maint:NoSchedule-")
    assert "cordoned" in kubectl(served, "cordon", "gpu-p5-08")
    line = next(ln for ln in kubectl(served, "get", "nodes").splitlines() if ln.startswith("gpu-p5-08"))
    assert "SchedulingDisabled" in line
    assert "uncordoned" in kubectl(served, "uncordon", "gpu-p5-08")


def test_jobs_and_logs(served: Path) -> None:
    kubectl(served, "create", "namespace", "kubectl-test")
    kubectl(served, "-n", "kubectl-test", "create", "job", "hello", "--image=busybox", "--", "echo", "hello", "sweeper")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        out = kubectl(served, "-n", "kubectl-test", "get", "jobs")
        if "Complete" in out:
            break
        time.sleep(0.1)
    assert out.splitlines()[0].split()[:3] == ["NAME", "STATUS", "COMPLETIONS"]
    assert "hello" in out and "Complete" in out and "1/1" in out
    assert kubectl(served, "-n", "kubectl-test", "logs", "job/hello").strip() == "hello sweeper"


ROOT = Path(__file__).resolve().parents[2]


def kubectl_fails(kc: Path, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(kc), "HOME": str(kc.parent)}
    proc = subprocess.run([KUBECTL, *args], capture_output=True, text=True, env=env, timeout=60)  # type: ignore[list-item]
    assert proc.returncode != 0, f"kubectl {' '.join(args)} succeeded: {proc.stdout}"
    return proc.stderr


def test_apply_the_deploy_manifests(served: Path) -> None:
    """kubectl apply validates against the server (it finds fieldValidation on each kind's PATCH in
    /openapi/v3), creates what is missing and patches what is there; `--server-side` sends an apply
    patch. Done twice, nothing changes the second time."""
    out = kubectl(served, "apply", "-f", str(ROOT / "deploy" / "cronjob.yaml"))
    for made in ("serviceaccount/sweeper created", "clusterrole.rbac.authorization.k8s.io/sweeper created",
                 "rolebinding.rbac.authorization.k8s.io/sweeper-node-events created",
                 "persistentvolumeclaim/sweeper-state created", "cronjob.batch/sweeper created",
                 "configmap/sweeper-policies created", "networkpolicy.networking.k8s.io/sweeper created",
                 "namespace/sweeper-remediation configured", "serviceaccount/sweeper-remediation created"):
        assert made in out, out
    out = kubectl(served, "apply", "-f", str(ROOT / "deploy"))
    created = sorted(line.split()[0] for line in out.splitlines() if line.endswith(" created"))
    assert "cronjob.batch/sweeper unchanged" in out and created == sorted(  # the optional RBAC, the policies
        [f"clusterrole{b}.rbac.authorization.k8s.io/sweeper-{what}" for what in ("evictions", "karpenter")
         for b in ("", "binding")]
        + [f"validatingadmissionpolicy{b}.admissionregistration.k8s.io/sweeper-{what}"
           for what in ("jobs", "node-writes", "nodeclaims") for b in ("", "binding")]), out
    out = kubectl(served, "apply", "--server-side", "-f", str(ROOT / "deploy" / "cronjob.yaml"))
    assert "cronjob.batch/sweeper serverside-applied" in out, out
    assert kubectl(served, "-n", "sweeper", "get", "cronjob", "sweeper", "-o", "jsonpath={.spec.schedule}") \
        == "*/30 * * * *"
    assert "FIELD: schedule <string>" in kubectl(served, "explain", "cronjob.spec.schedule")
    typo = served.parent / "typo.yaml"
    typo.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo, namespace: sweeper}\nsepc: {}\n")
    assert 'unknown field "sepc"' in kubectl_fails(served, "apply", "-f", str(typo))
    assert 'unknown field "sepc"' in kubectl_fails(served, "apply", "--server-side", "-f", str(typo))


def test_serve_and_the_cronjob_replace_each_other(served: Path) -> None:
    """deploy/serve/serve.yaml and deploy/cronjob.yaml each carry the other controller switched off, so
    applying one over the other leaves one sweeper; `kubectl apply -f deploy/` is not recursive
    (https://kubernetes.io/docs/reference/kubectl/generated/kubectl_apply/: -R, --recursive), so it
    never applies the serve manifest by accident."""
    def state() -> tuple[str, str]:
        suspended = kubectl(served, "-n", "sweeper", "get", "cronjob", "sweeper", "-o", "jsonpath={.spec.suspend}")
        replicas = kubectl(served, "-n", "sweeper", "get", "deployment", "sweeper", "-o",
                           "jsonpath={.spec.replicas}")
        return suspended, replicas

    kubectl(served, "apply", "-f", str(ROOT / "deploy" / "cronjob.yaml"))
    assert state() == ("false", "0")
    out = kubectl(served, "apply", "-f", str(ROOT / "deploy" / "serve" / "serve.yaml"))
    assert "persistentvolumeclaim/sweeper-serve-state created" in out and "service/sweeper created" in out, out
    assert "deployment.apps/sweeper configured" in out and "cronjob.batch/sweeper configured" in out, out
    assert state() == ("true", "1")
    kubectl(served, "apply", "-f", str(ROOT / "deploy"))
    assert state() == ("false", "0")


def test_server_dry_run_changes_nothing(served: Path) -> None:
    """Every `--dry-run=server` write answers as the write would and leaves the object as it was."""
    def version(*what: str) -> str:
        return kubectl(served, "get", *what, "-o", "jsonpath={.metadata.resourceVersion}")

    before = version("node", "gpu-p5-03")
    assert "(server dry run)" in kubectl(served, "cordon", "gpu-p5-03", "--dry-run=server")
    kubectl(served, "taint", "node", "gpu-p5-03", "a=b:NoSchedule", "--dry-run=server")  # says "tainted" all the same
    assert "(server dry run)" in kubectl(served, "label", "node", "gpu-p5-03", "x=y", "--dry-run=server")
    out = kubectl(served, "drain", "gpu-p5-02", "--dry-run=server", "--ignore-daemonsets", "--force")
    assert "evicting pod training/" in out and "drained (server dry run)" in out
    assert version("node", "gpu-p5-03") == before
    nodes = kubectl(served, "get", "nodes")
    assert "SchedulingDisabled" not in nodes
    assert kubectl(served, "get", "node", "gpu-p5-03", "-o", "jsonpath={.spec.taints}") == ""
    assert "gpu-p5-02" in kubectl(served, "get", "pods", "-n", "training", "-o", "wide")
    kubectl(served, "create", "configmap", "dry", "--from-literal=a=b", "--dry-run=server")
    assert "NotFound" in kubectl_fails(served, "get", "configmap", "dry")
    kubectl(served, "create", "configmap", "wet", "--from-literal=a=b")
    wet = version("configmap", "wet")
    kubectl(served, "delete", "configmap", "wet", "--dry-run=server")
    kubectl(served, "patch", "configmap", "wet", "-p", '{"data":{"a":"c"}}', "--dry-run=server")
    assert version("configmap", "wet") == wet
    assert kubectl(served, "get", "configmap", "wet", "-o", "jsonpath={.data.a}") == "b"
    kubectl(served, "delete", "configmap", "wet")


def test_field_selector_on_unschedulable(served: Path) -> None:
    schedulable = kubectl(served, "get", "nodes", "--field-selector", "spec.unschedulable=false", "-o", "name")
    assert len(schedulable.split()) == 16
    assert kubectl(served, "get", "nodes", "--field-selector", "spec.unschedulable=true", "-o", "name").strip() == ""


def test_auth_can_i_and_health(served: Path) -> None:
    """`kubectl auth can-i --list` reads a SelfSubjectRulesReview: the kubeconfig's user is the admin."""
    lines = kubectl(served, "auth", "can-i", "--list").splitlines()
    assert lines[0].split()[:2] == ["Resources", "Non-Resource"] and lines[1].split() == ["*.*", "[]", "[]", "[*]"]
    assert kubectl(served, "auth", "can-i", "delete", "nodes").strip() == "yes"
    for path in ("/healthz", "/livez", "/readyz"):
        assert kubectl(served, "get", "--raw", path) == "ok"
    assert "readyz check passed" in kubectl(served, "get", "--raw", "/readyz?verbose")


def test_get_nodes_watch_shows_changes_as_they_happen(served: Path) -> None:
    """`kubectl get nodes -w` lists the nodes, then watches from the list's resourceVersion and
    prints each change as it comes (the watch protocol:
    https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes)."""
    env = {**os.environ, "KUBECONFIG": str(served), "HOME": str(served.parent)}
    proc = subprocess.Popen([KUBECTL, "get", "nodes", "-w"], stdout=subprocess.PIPE,  # type: ignore[list-item]
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()  # type: ignore[union-attr]

    def next_line() -> str:
        try:
            return lines.get(timeout=30)
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"kubectl get nodes -w printed nothing more: {proc.stderr.read()}") from None  # type: ignore[union-attr]

    try:
        listed = [next_line() for _ in range(17)]  # the header and 16 nodes
        assert listed[0].split()[:2] == ["NAME", "STATUS"] and listed[-1].startswith("gpu-p5-15")
        kubectl(served, "cordon", "gpu-p5-11")
        changed = next_line()
        assert changed.split()[:2] == ["gpu-p5-11", "Ready,SchedulingDisabled"], changed
        kubectl(served, "uncordon", "gpu-p5-11")
        assert next_line().split()[:2] == ["gpu-p5-11", "Ready"]
        assert proc.poll() is None, "the watch stays open"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        kubectl(served, "uncordon", "gpu-p5-11")
