"""The simulated cluster as a pytest fixture: a real HTTP server on a free loopback port,
reached with the official `kubernetes` client exactly as in production."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sweeper.config import Config
from sweeper.history import History
from sweeper.kube import Kube, RetryPolicy
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.server import ApiServer
from sweeper.sweep import Sweep

# Each history test's store, on SQLite and on PostgreSQL: the fixtures backend, new_state, postgres_database.
pytest_plugins = ["tests.history_backends"]


@dataclass
class Sim:
    cluster: SimCluster
    server: ApiServer
    kubeconfig: Path
    kube: Kube
    core: client.CoreV1Api
    batch: client.BatchV1Api
    api_client: client.ApiClient

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
        """Poll in real time (the cluster steps in a background thread)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    def writes_to(self, node: str) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.cluster.store.requests
                if m in ("PATCH", "PUT", "DELETE") and p == f"/api/v1/nodes/{node}"]


def fleet_spec(nodes: int = 4, faults: dict[str, Any] | None = None, workloads: list[dict[str, Any]] | None = None,
               **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "test", "seed": 3, "speed": 600,
        "node_groups": [{"name_prefix": "gpu-", "count": nodes, "instance_type": "p5.48xlarge", "age": "2d"}],
        "faults": faults or {}, "workloads": workloads or [],
    }
    spec.update(extra)
    return spec


@pytest.fixture
def make_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    started: list[Sim] = []

    def start(spec: dict[str, Any] | None = None, **kw: Any) -> Sim:
        fleet = parse_fleet(spec or fleet_spec(**kw))
        cluster = SimCluster(fleet)
        server = ApiServer(cluster).start()
        kc = server.write_kubeconfig(tmp_path / f"kubeconfig-{len(started)}")
        kube = Kube.from_config(str(kc), clock=cluster.clock)
        kube.retry = RetryPolicy(attempts=8, base=0.5)
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kc), client_configuration=cfg)
        api = client.ApiClient(cfg)
        sim = Sim(cluster, server, kc, kube, client.CoreV1Api(api), client.BatchV1Api(api), api)
        started.append(sim)
        return sim

    yield start
    for s in started:
        s.kube.close()
        s.api_client.close()
        s.server.stop()


@pytest.fixture
def sim(make_sim: Callable[..., Sim]) -> Sim:
    return make_sim()


# check_timeout: 1800 simulated seconds are 3 s of real time at the fleets' 600x, so that a check on
# a loaded machine ends by its result, never by its deadline (at 300, half a second, a busy CI
# machine once turned a live sweep's XID 79 into a hung check).
TEST_CONFIG = Config(max_nodes=8, max_percent=100, min_node_age=600, interval=86400, poll_interval=5,
                     check_timeout=1800, run_deadline=0)


# Karpenter replaces the nodes of NodePool "gpu"; a replacement is waited for 30 simulated minutes.
KARPENTER = replace(TEST_CONFIG, remediation={"default": "manual", "by_pool": {"gpu": "karpenter"}, "by_profile": {}},
                    replacement_wait=1800)


def pool_fleet(nodes: int, faults: dict[str, Any]) -> dict[str, Any]:
    """A fleet whose nodes belong to Karpenter's NodePool "gpu" (the pool KARPENTER replaces)."""
    spec = fleet_spec(nodes=nodes, faults=faults)
    spec["node_groups"][0]["labels"] = {"karpenter.sh/nodepool": "gpu"}
    return spec


def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials moto accepts, so that boto3 never looks for real ones."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's S3 with the evidence bucket `gpu-evidence`."""
    import boto3
    from moto import mock_aws

    fake_aws_credentials(monkeypatch)
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="gpu-evidence")
        yield client


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    h = History(tmp_path / "history.db")
    yield h
    h.close()


def run_sweep(sim: Sim, history: History, cfg: Config = TEST_CONFIG, **kw: Any) -> Any:
    events: list[tuple[str, dict[str, Any]]] = []
    sw = Sweep(sim.kube, cfg, history, clock=sim.cluster.clock, emit=lambda e, d: events.append((e, d)), **kw)
    report = sw.run()
    report.events = events  # type: ignore[attr-defined]
    return report


def held_then_released_by_a_person(make_sim: Callable[..., Sim], history: History) -> tuple[Sim, Config, Any]:
    """An XID 79 node held by one run, a person taking Sweeper's taint off, and the next run, which
    marks that a false positive: the simulated cluster, the config and that next run's report."""
    from dataclasses import replace

    sim = make_sim(nodes=2, faults={"gpu-01": {"xids": [{"code": 79, "gpu": 3}]}})
    cfg = replace(TEST_CONFIG, interval=0)
    first = run_sweep(sim, history, cfg)
    assert {o.node: o.action for o in first.outcomes}["gpu-01"] == "held"
    node = sim.core.read_node("gpu-01")
    sim.core.patch_node("gpu-01", {"spec": {"taints": [t.to_dict() for t in node.spec.taints
                                                       if t.key != cfg.taint_key]}})
    second = run_sweep(sim, history, cfg)
    assert any(d.get("action") == "marked a false positive" for d in second.reconciled)
    return sim, cfg, second


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`sweeper demo` as a user runs it, once in a process (the CLI's test and the report's read it, and
    share an xdist group): at 80 columns, as in a pipe. Its output, its history and report, and the
    fleet table it printed (node -> state, last verdict, sweeps)."""
    from click.testing import CliRunner

    from sweeper.cli import main

    state = tmp_path_factory.mktemp("demo") / "demo.db"
    res = CliRunner().invoke(main, ["demo", "--state", str(state)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    summary: dict[str, dict[str, Any]] = {}
    table = res.stdout.split("── the fleet ", 1)[-1].split("\n── ", 1)[0]
    for line in table.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 7 and cells[1].startswith("gpu-"):  # a "│" in a reason splits only its cell
            summary[cells[1]] = {"state": cells[2], "verdict": cells[3], "sweeps": int(cells[4])}
    assert summary, f"no fleet table in the demo's output:\n{res.stdout[-3000:]}"
    return {"state": state, "page": state.with_name("report.html"), "out": res.stdout, "summary": summary}


# -- how the suite is scheduled (docs/testing.md) ------------------------------------------------------
# Tests that need the wall clock, not the simulated one: a signal to another process at a chosen moment,
# a race between processes, a deadline that production measures in real seconds. They keep their real
# waits; `-m realtime` runs only them, `-m "not realtime"` leaves them out. Tests in tests/cluster carry
# the marker themselves; these, outside it, get it here: node id prefix -> why.
REALTIME_ELSEWHERE = {
    "tests/test_render_child.py::test_a_c_level_loop_is_killed_at_the_deadline":
        "the render worker is SIGKILLed at a wall-clock deadline",
    "tests/test_render_child.py::test_a_worker_that_dies_mid_render_names_its_limits":
        "a SIGKILL sent to the worker a moment into a render",
    "tests/test_render_child.py::test_sigterm_of_the_parent_leaves_no_worker":
        "a SIGTERM to a parent process mid-render, and the worker gone within real seconds",
    "tests/test_procs.py::test_signals_reach_a_real_process":
        "a served simulator forked from the zygote, stopped by SIGTERM and by SIGKILL",
    "tests/test_security_data.py::test_many_requests_for_the_report_share_one_render":
        "concurrent HTTP clients and a real socket timeout",
}
# Modules (or tests: node id prefixes) whose fixture is costly (a served simulator in a process of its
# own, four simulated weeks of history, the demo): under pytest-xdist's --dist loadgroup each group runs
# on one worker, so the fixture is built once rather than once per worker that draws one of its tests.
SHARED_FIXTURE_MODULES = {
    "tests/cluster/test_kubectl.py": "served-simulator",
    "tests/test_history_policy.py": "four-weeks",
    "tests/test_report.py": "demo",
    "tests/test_cli.py::test_demo_runs_end_to_end": "demo",
}
# The longest single tests, started first so that no worker begins one when the others are done.
LONG_FIRST = (
    "tests/test_wheel.py",
    "tests/test_dcgm_images.py::test_the_admission_policy_allows_every_dcgm_build",
    "tests/test_quality.py",
    "tests/test_security_deploy.py::test_the_deploy_files_are_what_the_generators_print",
)


def _rank(item: pytest.Item) -> int:
    nodeid = item.nodeid
    if any(nodeid.startswith(p) for p in LONG_FIRST):
        return 0
    return 1 if item.get_closest_marker("realtime") else 2


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist appends a group to the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for prefix, why in REALTIME_ELSEWHERE.items():
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.realtime(why))
        group = next((g for prefix, g in SHARED_FIXTURE_MODULES.items() if item.nodeid.startswith(prefix)), None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker sorts alike (a stable sort)
        items.sort(key=_rank)



@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reports that it is done
def pytest_sessionfinish(session: pytest.Session) -> None:
    """End the zygote `tests.procs` forks sweeps from (if a test started it) and reap it, so that its
    CPU time, and its children's, counts to this process as a subprocess's would."""
    import sys

    zygote = sys.modules.get("tests.procs")
    if zygote is not None:
        zygote.stop()
