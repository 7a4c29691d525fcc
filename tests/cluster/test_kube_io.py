"""The adapter's requests when the apiserver does not answer as one: a server that accepts the
connection and then says nothing, a watch that goes silent, a TLS handshake that fails. Each
ends in a bounded time as exit 3 with the server named, never a hang or an internal error.

The silent servers here are real loopback sockets; the TLS ones are the simulated apiserver.
What the client does with a timeout: `_request_timeout=(connect, read)` becomes urllib3's
Timeout(connect=..., read=...) in kubernetes/client/rest.py, and the read timeout bounds each
read of the socket (https://urllib3.readthedocs.io/en/stable/reference/urllib3.util.html#urllib3.util.Timeout).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sweeper.actions.jobwatch import RunWatch
from sweeper.cli import main
from sweeper.clock import WallClock
from sweeper.errors import KubeError, Transient
from sweeper.kube import Kube, RetryPolicy, TimedOut
from sweeper.sim.cluster import SimCluster
from sweeper.sim.fleet import parse_fleet
from sweeper.sim.server import ApiServer
from tests.conftest import Sim, fleet_spec

ROOT = Path(__file__).resolve().parents[2]
CHUNKED_200 = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")


class Silent:
    """A TCP server on a loopback port that accepts every connection, reads the request, sends
    `head` (nothing by default) and then not another byte until it is closed."""

    def __init__(self, head: bytes = b"") -> None:
        self.head = head
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            if self.head:
                conn.sendall(self.head)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for c in self._conns:
            c.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def write_kubeconfig(path: Path, server: str, ca: Path | None = None) -> Path:
    cluster: dict[str, Any] = {"server": server, **({"certificate-authority": str(ca)} if ca else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def kube_at(kubeconfig: Path, **policy: Any) -> Kube:
    kube = Kube.from_config(str(kubeconfig))
    kube.retry = RetryPolicy(**{"attempts": 8, "base": 0.01, **policy})
    return kube


def one_error_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in text, text
    return lines[0]


# -- timeouts ---------------------------------------------------------------------------------
@pytest.mark.realtime("a request timeout in real seconds, in a process of its own so that a hang cannot hold the run")
def test_plan_against_a_silent_apiserver_is_exit_3_within_the_configured_timeout(silent: Silent,
                                                                                 tmp_path: Path) -> None:
    """A server that accepts the connection and never answers: `plan` stops after the config's
    api_timeout, tried twice (not api_attempts times), and says that the apiserver did not answer."""
    kc = write_kubeconfig(tmp_path / "kc", silent.url)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("api_timeout: 0.5\napi_attempts: 6\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sweeper.cli", "plan", "--kubeconfig", str(kc), "--config", str(cfg),
                           "--state", str(tmp_path / "h.db")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    elapsed = time.monotonic() - started
    assert proc.returncode == 3, proc.stderr
    line = one_error_line(proc.stderr)
    assert f"the apiserver at {silent.url} did not answer within 0.5 s" in line and "api_timeout" in line, line
    assert silent.accepted == 2, "a silent apiserver is asked twice, not api_attempts times"
    assert elapsed < 30, elapsed


def test_every_call_carries_the_policys_timeout(silent: Silent, tmp_path: Path) -> None:
    """Reads and writes alike, and a call retried under a policy set after the adapter was made."""
    kube = kube_at(write_kubeconfig(tmp_path / "kc", silent.url), read_timeout=0.2)
    assert kube.api_client.request_timeout == (0.2, 0.2)  # the connect timeout is never the longer one
    for call in (lambda: kube.get_node("gpu-00"), lambda: kube.list_pods(),
                 lambda: kube.patch_node("gpu-00", [{"op": "add", "path": "/metadata/labels/x", "value": "y"}]),
                 lambda: kube.get_lease("sweeper", "sweeper")):
        started = time.monotonic()
        with pytest.raises(TimedOut, match="did not answer within 0.2 s"):
            call()
        assert time.monotonic() - started < 10
    assert kube.requests == 8 and silent.accepted == 8, "each call tried twice"
    kube.close()


def test_a_slow_simulated_apiserver_times_out_after_two_tries(make_sim) -> None:
    """The simulated apiserver answering later than the read timeout (api_faults.latency, in real
    time): a TimedOut naming the server, after two tries whatever the attempts."""
    sim: Sim = make_sim(fleet_spec(nodes=2, api_faults={"slow_rate": 1.0, "latency": 1.5}))
    sim.kube.retry = RetryPolicy(attempts=8, base=0.01, read_timeout=0.2)
    with pytest.raises(TimedOut) as err:
        sim.kube.list_nodes()
    assert sim.server.url in str(err.value) and err.value.exit_code == 3
    assert sum(1 for m, p in sim.cluster.store.requests if (m, p) == ("GET", "/api/v1/nodes")) == 2


def test_a_pod_log_that_stops_coming_is_a_timeout(tmp_path: Path) -> None:
    """A log whose head came and whose body never does: cut at the read timeout."""
    server = Silent(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\npartial")
    try:
        kube = kube_at(write_kubeconfig(tmp_path / "kc", server.url), read_timeout=0.3)
        with pytest.raises(TimedOut, match="read log of pod sweeper-checks/p: the apiserver at .* did not answer"):
            kube.pod_log("sweeper-checks", "p")
        kube.close()
    finally:
        server.close()


def test_a_watch_that_goes_silent_is_cut(silent: Silent, tmp_path: Path) -> None:
    """The apiserver may send nothing until it ends a watch at timeoutSeconds, so the client waits
    that long plus its read timeout between reads; a stream silent longer is a Transient error, and
    so is a watch whose head never comes (its error names the time the watch waited)."""
    kube = kube_at(write_kubeconfig(tmp_path / "kc-silent", silent.url), read_timeout=0.3)
    with pytest.raises(TimedOut, match=r"watch pods: the apiserver at .* did not answer within 1.3 s$"):
        kube.watch("pods", "sweeper", "", "1", timeout_seconds=1)
    kube.close()
    server = Silent(CHUNKED_200)
    try:
        kube = kube_at(write_kubeconfig(tmp_path / "kc", server.url), read_timeout=0.3)
        stream = kube.watch("pods", "sweeper", "", "1", timeout_seconds=1)
        started = time.monotonic()
        with pytest.raises(Transient, match="the watch went silent: no event and no end of the stream in 1.3 s"):
            list(stream)
        assert 1.0 <= time.monotonic() - started < 10
        kube.close()
    finally:
        server.close()


class _QuietApiserver(BaseHTTPRequestHandler):
    """Lists answer at once (empty, at resourceVersion 7); watches send their head and then nothing."""

    lists: list[str] = []
    watches: list[str] = []
    stop = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if "watch=" in self.path:
            self.watches.append(self.path)
            self.wfile.write(CHUNKED_200)
            self.wfile.flush()
            self.stop.wait(30)
            return
        self.lists.append(self.path)
        body = json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
                           "items": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_run_watch_whose_stream_goes_silent_lists_again(tmp_path: Path) -> None:
    """The run's watch, silent past its timeoutSeconds and the read timeout, is noticed: the run
    lists again and watches again, instead of waiting on the stream for ever."""
    handler = type("Handler", (_QuietApiserver,), {"lists": [], "watches": [], "stop": threading.Event()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    logged: list[str] = []
    kube = kube_at(write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{httpd.server_address[1]}"),
                   read_timeout=0.3)
    rw = RunWatch(kube, "sweeper-checks", "sweeper.dev/run-id=r", WallClock(), 0.05, log=logged.append,
                  watch_timeout=1)
    try:
        rw.changed("j")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (rw.relists >= 2 and len(handler.watches) >= 4):
            time.sleep(0.05)
        assert rw.relists >= 2 and len(handler.watches) >= 4, (rw.relists, handler.watches, logged)
        assert any("went silent" in m and "listing again" in m for m in logged), logged
        assert not rw.polling, "a silent watch is watched again, not given up for polling"
    finally:
        rw.close()
        handler.stop.set()
        httpd.shutdown()
        httpd.server_close()
        kube.close()


# -- TLS ----------------------------------------------------------------------------------------
def _tls_sim(tmp_path: Path, san: str) -> tuple[ApiServer, Path]:
    """The simulated apiserver over HTTPS, with a self-signed certificate for `san` (as in test_rbac.py)."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=kubernetes", "-addext", f"subjectAltName={san}"],
                   check=True, capture_output=True)
    server = ApiServer(SimCluster(parse_fleet(fleet_spec(nodes=2))))
    server.enable_tls(str(cert), str(key))
    return server.start(), cert


def _plan(kubeconfig: Path, tmp_path: Path) -> Any:
    return CliRunner().invoke(main, ["plan", "--kubeconfig", str(kubeconfig), "--state", str(tmp_path / "h.db")])


def test_https_to_a_plain_http_apiserver_is_exit_3_naming_the_tls_error(sim: Sim, tmp_path: Path) -> None:
    """The client's own handling of urllib3's SSLError raises AttributeError ('NoneType' object has no
    attribute 'decode', kubernetes/client/api_client.py, on the ApiException that rest.py makes with
    no body): the adapter reads the TLS error behind it, and does not try again."""
    url = sim.server.url.replace("http://", "https://")
    res = _plan(write_kubeconfig(tmp_path / "kc", url), tmp_path)
    assert res.exit_code == 3, res.output
    line = one_error_line(res.stderr)
    assert f"TLS with the apiserver at {url} failed" in line and "WRONG_VERSION_NUMBER" in line, line
    assert "http://" in line and "certificate-authority" in line and "proxy" in line, line
    kube = kube_at(tmp_path / "kc")
    with pytest.raises(KubeError, match="wrong version number") as err:
        kube.list_nodes()
    assert not isinstance(err.value, Transient) and kube.requests == 1, "a TLS failure is not tried again"
    kube.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make the server's certificate")
def test_a_certificate_for_another_name_or_from_an_unknown_ca_is_exit_3(tmp_path: Path) -> None:
    server, cert = _tls_sim(tmp_path, "DNS:apiserver.example")
    try:
        res = _plan(write_kubeconfig(tmp_path / "kc", server.url, ca=cert), tmp_path)
        assert res.exit_code == 3, res.output
        line = one_error_line(res.stderr)
        assert f"TLS with the apiserver at {server.url} failed" in line, line
        assert "CERTIFICATE_VERIFY_FAILED" in line and "127.0.0.1" in line, line  # ssl's words: not valid for it
        res = _plan(write_kubeconfig(tmp_path / "kc-no-ca", server.url), tmp_path)
        assert res.exit_code == 3, res.output
        line = one_error_line(res.stderr)
        assert "CERTIFICATE_VERIFY_FAILED" in line and "self-signed certificate" in line, line
    finally:
        server.stop()
    server, cert = _tls_sim(tmp_path, "IP:127.0.0.1")
    try:  # the same server with its own CA named: it answers
        res = _plan(write_kubeconfig(tmp_path / "kc-ok", server.url, ca=cert), tmp_path)
        assert res.exit_code == 0, res.output
    finally:
        server.stop()


# -- nodes, with a local history and no cluster ----------------------------------------------------
def test_nodes_without_the_cluster_suggests_offline(make_sim, tmp_path: Path) -> None:
    """`report` falls back to the last plan; `nodes` says how to read the history alone."""
    sim: Sim = make_sim(nodes=2)
    state = tmp_path / "h.db"
    cfg = tmp_path / "config.yaml"
    cfg.write_text("api_attempts: 1\nmax_percent: 100\npoll_interval: 0.02\ncheck_timeout: 1800\n")
    runner = CliRunner()
    res = runner.invoke(main, ["sweep", "--kubeconfig", str(sim.kubeconfig), "--state", str(state),
                               "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        gone = write_kubeconfig(tmp_path / "gone", f"http://127.0.0.1:{s.getsockname()[1]}")
    res = runner.invoke(main, ["nodes", "--kubeconfig", str(gone), "--state", str(state), "--config", str(cfg)])
    assert res.exit_code == 3, res.output
    line = one_error_line(res.stderr)
    assert "connection failed" in line and f"`sweeper nodes --offline` shows the history at {state}" in line, line
    res = runner.invoke(main, ["nodes", "--offline", "--state", str(state), "--config", str(cfg)])
    assert res.exit_code == 0 and "gpu-00" in res.stdout, res.output
