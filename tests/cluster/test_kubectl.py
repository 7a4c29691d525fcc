"""kubectl against `sweeper sim serve`: the simulated cluster must look like a real one."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
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
