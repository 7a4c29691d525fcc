"""Issue 24, point 3: the history where people are. A person with a kubeconfig and no local history
file sees the history the cluster's `sweeper serve` keeps: `sweeper nodes`, `history NODE` and
`report` read it through the API server's service proxy
(https://kubernetes.io/docs/tasks/access-application-cluster/access-cluster-services/#manually-constructing-apiserver-proxy-urls:
`/api/v1/namespaces/NAMESPACE/services/SERVICE_NAME[:PORT_NAME]/proxy/`), with their own
credentials, so RBAC decides (`get` on the `services/proxy` subresource:
https://kubernetes.io/docs/reference/access-authn-authz/rbac/#referring-to-resources). When the
service cannot be read, they show what the nodes' labels and annotation say, and say so.

The simulated apiserver forwards to a `sweeper serve` HTTP server started here on 127.0.0.1 through
the Service's Endpoints (a real apiserver refuses a loopback address in Endpoints; the simulator
does not check it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client

from sweeper.cli import main
from sweeper.config import Config
from sweeper.history import History
from sweeper.schedules import with_default_schedule
from sweeper.serve import Server
from tests.conftest import Sim

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path) -> Path:
    """check_timeout 1800 simulated seconds, 3 s of real time at the fleets' 600x (as TEST_CONFIG's): at 120,
    a fifth of a second, a loaded machine left a check pod "never started before its deadline", inconclusive."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"max_nodes": 4, "max_percent": 100, "poll_interval": 0.02, "check_timeout": 1800}))
    return path


@pytest.fixture
def swept(make_sim, tmp_path: Path) -> Sim:
    """A cluster swept once (gpu-01 is missing two GPUs: reboot), its history in the 'volume' dir."""
    sim: Sim = make_sim(nodes=3, faults={"gpu-01": {"missing_gpus": 2}})
    res = CliRunner().invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--config", str(write_config(tmp_path)),
                                    "--state", str(tmp_path / "volume" / "history.db"), "-o", "json"])
    assert res.exit_code == 0, res.output
    return sim


@pytest.fixture
def serving(swept: Sim, tmp_path: Path) -> Iterator[Server]:
    """`sweeper serve`'s HTTP side on the cluster's history (no schedule fires: the test reads only),
    behind a Service `sweeper` in the controller's namespace, as deploy/serve/serve.yaml has it."""
    cfg, _ = with_default_schedule(Config())
    hist = History(tmp_path / "volume" / "history.db")
    server = Server(cfg, swept.kube, hist, port=0, host="127.0.0.1", log=lambda m: None)
    server.start_http()
    swept.core.create_namespaced_service("sweeper", client.V1Service(
        metadata=client.V1ObjectMeta(name="sweeper"),
        spec=client.V1ServiceSpec(ports=[client.V1ServicePort(name="http", port=8080, target_port="http")],
                                  selector={"app.kubernetes.io/name": "sweeper"})))
    swept.core.create_namespaced_endpoints("sweeper", client.V1Endpoints(
        metadata=client.V1ObjectMeta(name="sweeper"),
        subsets=[client.V1EndpointSubset(addresses=[client.V1EndpointAddress(ip="127.0.0.1")],
                                         ports=[client.CoreV1EndpointPort(name="http", port=server.port)])]))
    yield server
    server.stop()
    hist.close()


def laptop(sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[CliRunner, list[str]]:
    """A shell on a laptop: a kubeconfig, no --state, no SWEEPER_STATE, no local history file."""
    home = tmp_path / "laptop"
    home.mkdir(exist_ok=True)
    monkeypatch.chdir(home)
    return CliRunner(env={"SWEEPER_STATE": None, "SWEEPER_CONFIG": None}), ["--kubeconfig", str(sim.kubeconfig)]


def test_nodes_history_and_report_read_the_clusters_history_through_the_api_server(
        swept: Sim, serving: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner, kc = laptop(swept, tmp_path, monkeypatch)
    res = runner.invoke(main, ["nodes", *kc, "-o", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    verdicts = {r["node"]: r["verdict"] for r in doc["nodes"]}
    assert verdicts == {"gpu-00": "pass", "gpu-01": "reboot", "gpu-02": "pass"}, "the cluster's history, not `never`"
    assert "the cluster's Sweeper" in doc["source"] and "read from the cluster's Sweeper" in res.stderr
    assert not (tmp_path / "laptop" / "state").exists(), "a reader writes no history of its own"
    res = runner.invoke(main, ["nodes", *kc])
    assert res.exit_code == 0 and "3 GPU nodes (from the cluster's Sweeper" in res.stdout, res.output
    requests = [p for m, p in swept.cluster.store.requests if "/proxy/" in p]
    assert requests and all(p.startswith("/api/v1/namespaces/sweeper/services/sweeper:http/proxy/api/v1/")
                            for p in requests)

    res = runner.invoke(main, ["history", "gpu-01", *kc, "-o", "json"])
    assert res.exit_code == 0, res.output
    h = json.loads(res.stdout)
    assert h["sweeps"][0]["verdict"] == "reboot" and h["sweeps"][0]["run_id"], "the whole history, with its run"
    assert h["sweeps"][0]["problems"], "and its findings"
    res = runner.invoke(main, ["history", "gpu-01", *kc])
    assert res.exit_code == 0 and "history of gpu-01" in res.stdout, res.output
    res = runner.invoke(main, ["history", "gpu-77", *kc])
    assert res.exit_code == 2 and "no node 'gpu-77' in the cluster's Sweeper" in res.stderr, res.output

    res = runner.invoke(main, ["report", *kc, "-o", "r.html"])
    assert res.exit_code == 0, res.output
    page = (tmp_path / "laptop" / "r.html").read_text()
    assert "gpu-01" in page and "<html" in page.lower()
    res = runner.invoke(main, ["report", *kc, "--node", "gpu-01", "-o", "-"])
    assert res.exit_code == 0 and "gpu-01" in res.stdout, res.output


def reader_rules(proxy: bool) -> list:
    """What a reader is bound to: the Role deploy/serve/serve.yaml ships (`services/proxy` get, on
    the Service `sweeper`), unless `proxy` is False, and listing nodes (a person who runs kubectl)."""
    role = next(d for d in yaml.safe_load_all((ROOT / "deploy/serve/serve.yaml").read_text())
                if d and d["kind"] == "Role" and d["metadata"]["name"] == "sweeper-history-reader")
    nodes = (None, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]})
    return [nodes, *(("sweeper", r) for r in role["rules"] if proxy)]


def test_rbac_decides_and_a_forbidden_reader_sees_the_nodes_labels_and_is_told(
        swept: Sim, serving: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner, kc = laptop(swept, tmp_path, monkeypatch)
    swept.server.service_accounts["sim-token"] = ("alice", reader_rules(proxy=True))
    res = runner.invoke(main, ["nodes", *kc, "-o", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["source"].startswith("the cluster's Sweeper")
    # the laptop and the served Sweeper share the simulator's one token here, so the Sweeper's own
    # reads (DRA ResourceSlices, which a 403 reads as none) are refused as alice's too: only the
    # proxy is the reader's
    assert [p for _, _, p in swept.server.denied if "/proxy/" in p] == [], \
        "the shipped Role lets a reader through the proxy"

    swept.server.service_accounts["sim-token"] = ("alice", reader_rules(proxy=False))
    res = runner.invoke(main, ["nodes", *kc, "-o", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {r["node"]: r["verdict"] for r in doc["nodes"]} == {"gpu-00": "pass", "gpu-01": "reboot", "gpu-02": "pass"}
    assert doc["source"] == "the nodes' labels and annotations alone"
    assert "could not be read" in res.stderr and "forbidden" in res.stderr.lower(), res.stderr
    assert [p for _, _, p in swept.server.denied if "/proxy/" in p], "refused by RBAC, not by chance"
    res = runner.invoke(main, ["history", "gpu-01", *kc, "-o", "json"])
    assert res.exit_code == 0, res.output
    last = json.loads(res.stdout)["sweeps"]
    assert len(last) == 1 and last[0]["verdict"] == "reboot" and last[0]["reasons"], "the last-result annotation"
    res = runner.invoke(main, ["report", *kc, "-o", "r.html"])
    assert res.exit_code == 3 and "forbidden" in res.stderr.lower(), res.output


def test_with_no_sweeper_in_the_cluster_the_labels_say_it_and_so_does_the_command(
        swept: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Service at all (the CronJob's install, or `sweeper serve` not deployed): the apiserver
    answers 404, and the nodes' labels stand in."""
    runner, kc = laptop(swept, tmp_path, monkeypatch)
    res = runner.invoke(main, ["nodes", *kc])
    assert res.exit_code == 0, res.output
    assert "3 GPU nodes (from the nodes' labels and annotations alone)" in res.stdout
    assert "never" not in res.stdout.split("\n", 2)[2], "every node was swept, and its labels say when"
    assert "could not be read" in res.stderr and "not found" in res.stderr.lower(), res.stderr
