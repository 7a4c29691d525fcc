"""Issue 22, the data-handling attacks: each one as it was found, run against the code it hurt.

The report and `serve` escape every field whatever its type and forbid scripts (the report is
opened in headless Chromium); a result document's types are checked on `ingest`; one node's
bad annotation skips that node; `serve` survives an exception in a run and a local load of its
own (127.0.0.1 only), and /healthz says when sweeps have stopped; YAML aliases are refused;
template values cannot grow past their bounds through sharing; the parsers' regular
expressions are linear on a 1 MB line; a history file with triggers or views is refused; Slack
text is escaped for mrkdwn; the terminal shows format characters escaped.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.config import Config
from sweeper.errors import ConfigError, PlaybookError, StateError
from sweeper.history import History
from sweeper.policy import load_policy
from sweeper.report import gather, render
from sweeper.result import CheckResult, Metric, Result
from tests.conftest import TEST_CONFIG
from tests.weeks import ROOT

POLICY = load_policy(ROOT / "policies" / "default.yaml")
T0 = 1_800_000_000.0
# Runs in the page's context only if the page lets markup through: it marks the document.
PAYLOAD = "<img src=x onerror=\"document.documentElement.dataset.pwned='1'\"><script>document.title='pwned'</script>"


def _doc(gpu: Any = 0, value: Any = 1.0, metric_gpu: Any = 0) -> dict[str, Any]:
    return {"schema": "sweeper.dev/result/v1", "node": "gpu-00", "source": "sweeper",
            "started": "2027-01-15T08:00:00Z", "finished": "2027-01-15T08:01:00Z", "status": "fail",
            "checks": [{"name": "gpu.ecc", "status": "fail", "severity": "critical", "gpu": gpu, "message": "m"}],
            "metrics": [{"name": "ecc.aggregate_corrected", "value": value, "unit": "", "gpu": metric_gpu}]}


# -- 3. stored XSS ------------------------------------------------------------------------------
def test_ingest_refuses_a_result_whose_fields_have_the_wrong_types(tmp_path: Path) -> None:
    """DESIGN.md: a check's `gpu` and a metric's `gpu` are optional integers, a metric's `value` a
    number; anything else is not a result document, so it is an `error` and nothing of it is kept."""
    state = tmp_path / "h.db"
    for bad in (_doc(gpu=PAYLOAD), _doc(metric_gpu="GPU-1"), _doc(value="12"), _doc(value=True), _doc(gpu=True),
                _doc(gpu=-1), _doc(gpu=1.5)):
        doc = tmp_path / "r.json"
        doc.write_text(json.dumps(bad))
        res = CliRunner().invoke(main, ["ingest", "gpu-00", str(doc), "--format", "sweeper", "--new-node", "--state", str(state),
                                        "--json"])
        out = json.loads(res.stdout)
        assert out["status"] == "error" and out["checks"][0]["name"] == "sweeper.read", (bad, out)
    text = json.dumps(_doc()).replace('"value": 1.0', '"value": NaN')
    (tmp_path / "nan.json").write_text(text)
    res = CliRunner().invoke(main, ["ingest", "gpu-00", str(tmp_path / "nan.json"), "--format", "sweeper",
                                    "--no-record", "--json"])
    assert json.loads(res.stdout)["status"] == "error", "NaN is not a reading"
    h = History(state)
    assert not h.conn.execute("select count(*) from checks where typeof(gpu) not in ('integer', 'null')").fetchone()[0]
    assert not h.conn.execute("select count(*) from metrics").fetchone()[0]
    h.close()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_doc(gpu=3, value=7, metric_gpu=None)))
    res = CliRunner().invoke(main, ["ingest", "gpu-00", str(good), "--format", "sweeper", "--no-record", "--json"])
    assert json.loads(res.stdout)["status"] == "fail", "a well-typed document still reads"


def _hostile_history(path: Path) -> History:
    """A history written before results were type-checked: a string GPU on a check and a metric."""
    h = History(path)
    h.run_started("run-1", T0, "sweep")
    for i, (gpu, value) in enumerate(((0, 1.0), (PAYLOAD, 2.0), ("GPU-1", 3.0), (1, 4.0))):
        sid = h.sweep_started("run-1", "gpu-00", T0 + i * 3600, "sweep-light", "p5.48xlarge")
        h.result(sid, Result(node="gpu-00", source="sweeper", started=T0 + i * 3600, finished=T0 + i * 3600 + 60,
                             checks=(CheckResult("gpu.ecc", "fail", f"ecc {PAYLOAD}", "critical", gpu=gpu),),
                             metrics=(Metric("ecc.aggregate_corrected", value, "", gpu=gpu),)))
        h.sweep_finished(sid, T0 + i * 3600 + 120, "quarantine", [f"why {PAYLOAD}"],
                         {"verdict": "quarantine", "rules": [], "causes": [], "decided": T0, "policy": "default"})
    h.run_finished("run-1", T0 + 5 * 3600, "done", 1, {"gpu_node_profiles": {"gpu-00": "p5.48xlarge"}})
    return h


def test_report_draws_and_escapes_a_history_with_string_gpus(tmp_path: Path) -> None:
    """Once: a string `gpu` on a metric made `sweeper report` exit 70 (int and str compared) and a
    string `gpu` on a check went into the page as markup."""
    h = _hostile_history(tmp_path / "h.db")
    page = render(gather(h, POLICY, 0.0, T0 + 6 * 3600, 86400.0))
    assert PAYLOAD not in page and "<script>" not in page and "<img" not in page
    assert "&lt;img src=x onerror=" in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    res = CliRunner().invoke(main, ["report", "--state", str(tmp_path / "h.db"), "--offline", "-o",
                                    str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output


def test_every_text_field_of_the_history_is_escaped(tmp_path: Path) -> None:
    """Not only `gpu`: node and partner names, profiles, verdicts, rules, reasons, check names,
    codes and messages, metric names and units, action details, pair details."""
    x = "<i class=x>"
    h = History(tmp_path / "h.db")
    h.run_started("run-1", T0, "sweep")
    for i, verdict in enumerate(("quarantine", x)):
        node = f"gpu-{i}{x}"
        sid = h.sweep_started("run-1", node, T0 + i, f"book{x}", f"p5{x}")
        h.result(sid, Result(node=node, source=f"src{x}", started=T0 + i, finished=T0 + i + 60,
                             checks=(CheckResult(f"check{x}", "fail", f"msg{x}", "critical", gpu=x, code=x),),
                             metrics=(Metric("nccl.busbw_largest", 100.0 + i, f"GB/s{x}", gpu=x),
                                      Metric("ecc.aggregate_corrected", float(i), x, gpu=i))))
        h.sweep_finished(sid, T0 + i + 120, verdict, [f"why{x}"], {"verdict": verdict, "rules": [f"rule{x}"],
                                                                   "causes": [x], "decided": T0, "policy": x})
        h.action("run-1", node, T0 + i + 130, f"act{x}", f"detail{x}")
        h.pair_result("run-1", T0 + i + 140, node, f"partner{x}", "fail", "sweep", 10.0, f"pair{x}")
    h.run_finished("run-1", T0 + 3600, "done", 2, {"gpu_node_profiles": {f"gpu-0{x}": f"p5{x}"}})
    page = render(gather(h, POLICY, 0.0, T0 + 3600, 86400.0))
    assert "<i class=x>" not in page and page.count("&lt;i class=x&gt;") > 20


def test_the_hostile_report_runs_no_script_in_headless_chromium(tmp_path: Path) -> None:
    """The page as a browser reads it: the markup of a field is text, no element of it exists, and
    the page's policy would refuse a script even if one got in."""
    from tests.test_report import _browser

    h = _hostile_history(tmp_path / "h.db")
    page = tmp_path / "r.html"
    page.write_text(render(gather(h, POLICY, 0.0, T0 + 6 * 3600, 86400.0)))
    browser = _browser()
    try:
        browser.get(page.as_uri())
        time.sleep(0.3)  # an image's error event would have fired by now
        js = browser.execute_script
        assert js("return document.documentElement.dataset.pwned") is None
        assert js("return document.title") != "pwned"
        assert js("return document.querySelectorAll('script, img, iframe, object, embed').length") == 0
        cells = js("return [...document.querySelectorAll('table.findings td')].map(c => c.textContent)")
        assert PAYLOAD in cells, "the field is shown as the text it is"
        csp = js("return document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]').content")
        assert "default-src 'none'" in csp
    finally:
        browser.quit()


# -- 4. one annotation stops serve -------------------------------------------------------------
def _node(name: str, annotations: dict[str, str], allocatable: str = "8") -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations, "labels": {},
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"taints": [{"key": "sweeper.dev/sweep", "value": "sw-1", "effect": "NoSchedule"}]},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": allocatable},
                       "conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"bootID": "b1"}}}


def test_a_malformed_remediated_at_annotation_skips_that_node_with_a_warning() -> None:
    """A kubelet may write its own node's annotations (NodeRestriction lets it patch its Node:
    https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/#noderestriction);
    once, `remediated-at: yesterday` made discovery raise for the whole fleet."""
    from sweeper.fleet import plan

    cfg = Config()
    bad = {"sweeper.dev/recheck": "true", "sweeper.dev/remediation": "reboot", "sweeper.dev/boot-id": "b1",
           "sweeper.dev/remediated-at": "yesterday"}
    ok = dict(bad, **{"sweeper.dev/remediated-at": "2026-01-01T00:00:00Z"})
    p = plan([_node("gpu-bad", bad), _node("gpu-ok", ok), _node("gpu-junk", {}, allocatable="lots")], [], cfg, {},
             time.time())
    why = {d.node.name: (d.reason, d.detail) for d in p.skip}
    assert why["gpu-bad"][0] == "held" and "remediated-at annotation 'yesterday' is not a time" in why["gpu-bad"][1]
    assert "not back from its reboot" in why["gpu-ok"][1], "the node beside it is judged as before"
    assert "gpu-junk" in why, "an unreadable allocatable is that node's problem alone"
    warned = {d.node.name: d.warning for d in p.skip if d.warning}
    assert set(warned) == {"gpu-bad"} and "remediated-at='yesterday'" in warned["gpu-bad"]


def test_a_sweep_goes_on_past_a_node_with_a_malformed_annotation(make_sim: Any, history: History) -> None:
    """The whole run, against the simulated cluster: gpu-01 is held for a reboot (an earlier run
    recorded it) and its kubelet wrote a `remediated-at` that is not a time; it is skipped with a
    warning in the run's log and the other nodes are swept."""
    from tests.conftest import run_sweep

    sim = make_sim(nodes=3)
    now = sim.cluster.clock.now()
    history.run_started("sw-old", now - 3600, "sweep")
    sid = history.sweep_started("sw-old", "gpu-01", now - 3600, "sweep-light.yaml", "p5.48xlarge")
    history.sweep_finished(sid, now - 3500, "reboot", ["xid 79"])
    history.run_finished("sw-old", now - 3400, "done", 1, {})
    sim.core.patch_node("gpu-01", {"metadata": {"annotations": {
        "sweeper.dev/recheck": "true", "sweeper.dev/remediation": "reboot", "sweeper.dev/verdict": "reboot",
        "sweeper.dev/boot-id": sim.core.read_node("gpu-01").status.node_info.boot_id,
        "sweeper.dev/remediated-at": "not-a-time"}},
        "spec": {"taints": [{"key": "sweeper.dev/sweep", "value": "sw-old", "effect": "NoSchedule"}]}})
    report = run_sweep(sim, history, replace(TEST_CONFIG, min_node_age=0))
    assert {"gpu-00", "gpu-02"} <= {o.node for o in report.outcomes}
    logs = [str(d.get("msg", "")) for kind, d in report.events if kind == "log"]
    assert any("not times" in m and "not-a-time" in m for m in logs), logs


# -- 4, 5. serve survives bad data and load ----------------------------------------------------
class _Breaking:
    """The history, whose first `run_started` raises what no Sweeper code expects (a bug's shape)."""

    def __init__(self, inner: History) -> None:
        self.inner, self.broke, self.fleet_reads = inner, False, 0

    def run_started(self, *args: Any, **kwargs: Any) -> Any:
        if not self.broke:
            self.broke = True
            raise RuntimeError("not a SweeperError")
        return self.inner.run_started(*args, **kwargs)

    def fleet(self) -> Any:
        self.fleet_reads += 1
        return self.inner.fleet()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _get(url: str, timeout: float = 10) -> tuple[int, str, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - the test's own loopback server
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


@pytest.fixture
def server(make_sim: Any, history: History) -> Any:
    from sweeper.serve import Server

    sim = make_sim(nodes=2)
    cfg = replace(TEST_CONFIG, schedules=({"name": "often", "cron": "* * * * * *", "playbook": "sweep-light.yaml"},),
                  min_node_age=0, interval=1, poll_interval=0.05)
    srv = Server(cfg, sim.kube, _Breaking(history), port=0, log=lambda m: None, max_connections=8,
                 socket_timeout=1.0)
    yield srv
    srv.stop()


def test_serve_listens_on_loopback_unless_told_otherwise(server: Any) -> None:
    assert server.httpd.server_address[0] == "127.0.0.1"


def test_an_unexpected_exception_ends_only_its_run(server: Any, history: History) -> None:
    """Once the queue thread caught only SweeperError: one RuntimeError killed it for good, and
    /healthz kept answering 200 with no sweep running."""
    server.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not history.conn.execute(
            "select count(*) from runs where finished is not null").fetchone()[0]:
        time.sleep(0.2)
    assert server.history.broke, "the first run raised"
    assert history.conn.execute("select count(*) from runs where finished is not null").fetchone()[0] >= 1, \
        "a later firing ran: the queue thread lived on"
    assert _get(f"http://127.0.0.1:{server.port}/healthz")[:2] == (200, "ok\n")


def test_healthz_fails_when_the_queue_thread_is_dead_or_runs_stopped(server: Any) -> None:
    server.scheduler.start()  # the scheduler alone: the queue thread never started
    server.start_http()
    code, body, _ = _get(f"http://127.0.0.1:{server.port}/healthz")
    assert code == 503 and "queue thread is dead" in body
    server._queue.start()
    assert _get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    server.last_done = time.time() - server.stale_after - 1  # no run has ended for longer than allowed
    code, body, _ = _get(f"http://127.0.0.1:{server.port}/healthz")
    assert code == 503 and "no run has ended" in body


def test_many_requests_for_the_report_share_one_render_and_threads_stay_bounded(server: Any) -> None:
    """Once: 48 concurrent requests for / rendered 48 pages at once (1.04 GB on a 400-node history);
    1,000 open connections held 1,003 threads. Now one render serves them all, at most
    max_connections requests are in flight (the rest get 503 at once), and a silent socket is
    closed after the socket timeout."""
    server.start_http()
    url = f"http://127.0.0.1:{server.port}/"
    results: list[tuple[int, str, dict[str, str]]] = []

    def fetch() -> None:
        results.append(_get(url))

    workers = [threading.Thread(target=fetch) for _ in range(48)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert len(results) == 48
    served = [r for r in results if r[0] == 200]
    assert served and all(r[0] in (200, 503) for r in results)
    assert server.history.fleet_reads == 1, "one render for every request within the page's lifetime"
    assert all("script-src" not in r[2]["Content-Security-Policy"] and "default-src 'none'" in
               r[2]["Content-Security-Policy"] for r in served)
    assert len({r[1] for r in served}) == 1

    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(200)]
    try:
        time.sleep(0.3)
        assert threading.active_count() <= before + 8 + 2, "a thread per request only up to the limit"
        time.sleep(1.5)  # past the socket timeout: the silent ones are dropped
        assert _get(f"http://127.0.0.1:{server.port}/healthz")[0] in (200, 503)
        assert _get(url)[0] == 200, "the server answers again once the silent sockets time out"
    finally:
        for s in idle:
            s.close()


# -- 6. bounds that could be stepped around ------------------------------------------------------
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))


def test_yaml_aliases_are_refused_in_playbooks_configs_fleets_policies_and_xid_files(tmp_path: Path) -> None:
    """The 'billion laughs' of YAML (https://en.wikipedia.org/wiki/Billion_laughs_attack): nine
    levels of nine aliases are 9**9 items to whatever walks them; 405 bytes of them once took
    `sweeper run` to 10.4 GB while `lint` found nothing."""
    from sweeper.actions import load_all
    from sweeper.config import load_config
    from sweeper.lint import lint_paths
    from sweeper.playbook.model import load_playbook
    from sweeper.policy import load_policy as policy
    from sweeper.sim.fleet import load_fleet
    from sweeper.xid import load_catalogue

    book = tmp_path / "bomb.yaml"
    book.write_text("name: bomb\nvars:\n" + "".join("  " + line + "\n" for line in BOMB.splitlines())
                    + "tasks:\n  - debug: {msg: '{{ i }}'}\n")
    t0 = time.process_time()  # CPU time: a loaded machine stretches the clock, not the work
    with pytest.raises(PlaybookError, match="aliases"):
        load_playbook(book, load_all())
    report = lint_paths([book], Config())
    assert any("aliases" in p for p in report.problems), report.problems
    for loader in (load_config, load_fleet, policy, load_catalogue):
        f = tmp_path / "bomb-file.yaml"
        f.write_text(BOMB)
        with pytest.raises(ConfigError, match="alias"):
            loader(f)
    assert time.process_time() - t0 < 5


def test_jinja2_is_one_whose_sandbox_the_format_trick_does_not_escape() -> None:
    """Jinja2 3.1.5 and earlier: `|attr('format')` reaches a string's plain format method
    (CVE-2025-27516, https://github.com/pallets/jinja/security/advisories/GHSA-cpwx-vrp4-4pq7;
    3.1.4: CVE-2024-56326, GHSA-q2x7-8rv6-6q7h). Fixed in 3.1.6."""
    import jinja2
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = SpecifierSet(next(d for d in deps if d.lower().startswith("jinja2"))[len("jinja2"):])
    assert Version("3.1.5") not in spec and Version("3.1.4") not in spec and Version("3.1.6") in spec
    assert Version(jinja2.__version__) >= Version("3.1.6")
    from sweeper.templating import render

    with pytest.raises(PlaybookError):
        render("{{ ('{0.__class__.__init__.__globals__}'|attr('format'))(x) }}", {"x": object()})


def test_a_deep_compare_of_shared_lists_stops_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """`[a, a]` doubled forty times costs forty lists but is 2**40 items to `==`, which CPython
    compares in C without a pause where the render deadline could stop it. The deadline is
    raised here so that a slow (loaded) machine still reaches the compare: what must stop it is
    the template limit, never the clock."""
    from sweeper import templating
    from sweeper.templating import render

    monkeypatch.setattr(templating, "LIMITS", replace(templating.LIMITS, seconds=60.0))

    src = ("{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
           "{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}")
    result: list[BaseException | str] = []

    def go() -> None:
        try:
            result.append(render(src, {}))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            result.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(90)
    assert result, "the render was still running after 90 s"
    assert isinstance(result[0], PlaybookError) and "template limit" in str(result[0]), result[0]
    assert render("{{ [1, [2, 3]] == [1, [2, 3]] and (1, 2) < (1, 3) and {'a': [1]} != {} }}", {}) is True


# A 1 MB line of each shape that once sent a parser's regular expression quadratic.
ADVERSARIAL = [
    " " * (1 << 20),
    "a" + " " * (1 << 20),
    "|a" + " " * (1 << 20),
    "NVRM: Xid (PCI:0000:01:00): 79, " + "pid=" * (1 << 18),
    "NVRM: Xid (" + "0" * (1 << 20),
    "GPU 0" + " " * (1 << 20),
    "a" + "  a" * (1 << 18),
    "-" * (1 << 20),
    "0" * (1 << 20),
    "a:" * (1 << 19),
    "1 " * (1 << 19),
    "memory.used [" + "[" * (1 << 20),
    "|" + " " * (1 << 20) + "|",
]


@pytest.mark.parametrize("parser", ["detect", "dcgm", "kernel-log", "nccl", "nvidia-smi", "ibv-devinfo", "topo",
                                    "fi-info", "ping"])
def test_each_parser_reads_a_1mb_adversarial_line_within_a_second(parser: str) -> None:
    """Python's `re` backtracks: a pattern whose pieces can match the same text two ways is
    quadratic or worse in a line that almost matches (https://docs.python.org/3/howto/regex.html,
    and OWASP's ReDoS page). Once a 64 KB XID line took 6.6 s and a 40 KB DCGM line 45 s."""
    from sweeper import ingest

    for line in ADVERSARIAL:
        t0 = time.process_time()  # CPU seconds of this process: the bound holds on a loaded machine too
        try:
            if parser == "detect":
                ingest.detect(line)
            else:
                ingest.ingest(line, "gpu-00", parser, T0)
        except ConfigError:
            pass
        took = time.process_time() - t0
        assert took < 1.0, f"{parser} took {took:.2f}s on {line[:40]!r}..."


@pytest.mark.parametrize("parser", ["auto", "sweeper", "dcgm", "nccl", "kernel-log", "nvidia-smi", "ibv-devinfo",
                                    "topo", "fi-info", "ping"])
def test_json_nested_past_the_decoders_depth_is_an_error_result(parser: str) -> None:
    """json's decoder raises RecursionError, not ValueError, on arrays nested past the interpreter's
    recursion limit: 5 kB of `[` in a check pod's log (or its 4 KiB termination message) once ended
    the whole run. Every parser makes it an `error` result (never a pass, never an exception)."""
    from sweeper import ingest
    from sweeper.parsers import sweeper_result

    for text in ('{"schema": ' + "[" * 5000, "{" + '"a":{' * 5000, '{"a": 1}\n{"schema": ' + "[" * 5000):
        try:
            _, result = ingest.ingest(text, "gpu-00", parser, T0)
        except ConfigError:  # `auto` cannot tell the format: bad input (exit 2), no crash
            assert parser == "auto"
            continue
        assert result.status in ("error", "fail"), (parser, result.status)
    assert sweeper_result.parse_summary('{"schema": ' + "[" * 4000, "gpu-00", T0).status == "error"


# -- 7. smaller ---------------------------------------------------------------------------------
@pytest.mark.parametrize("ddl", [
    "create trigger t after insert on checks begin update checks set status = 'pass' where id = new.id; end",
    "create view v as select 1",
    "create table extra (x)",
])
def test_a_history_with_objects_its_migrations_never_make_is_refused(tmp_path: Path, ddl: str) -> None:
    """A trigger once turned a recorded `fail` into `pass` (or hung `ingest` on every insert).
    SQLite's advice for a database file from an untrusted source is `trusted_schema=OFF`
    (https://www.sqlite.org/security.html), and to look at its schema before using it."""
    path = tmp_path / "h.db"
    History(path).close()
    con = sqlite3.connect(path)
    con.execute(ddl)
    con.commit()
    con.close()
    with pytest.raises(StateError, match="not a Sweeper history"):
        History(path)
    res = CliRunner().invoke(main, ["history", "gpu-00", "--state", str(path)])
    assert res.exit_code == 3 and "refused" in res.output


def test_the_history_opens_with_trusted_schema_off(tmp_path: Path) -> None:
    h = History(tmp_path / "h.db")
    assert h.conn.execute("PRAGMA trusted_schema").fetchone()[0] == 0
    h.close()
    h = History(tmp_path / "h.db")  # a file it made itself opens again
    h.close()


def test_webhook_text_is_escaped_for_slack_mrkdwn() -> None:
    """Slack: `&`, `<` and `>` are control characters of message text and must be sent as
    `&amp;`, `&lt;`, `&gt;` (https://api.slack.com/reference/surfaces/formatting#escaping);
    unescaped, a kernel-log line could mention `<!channel>` or make a link."""
    from sweeper.notify import message

    m = message("gpu<1>", "replace", ["Xid 79 <!channel> <https://evil.example|click> & \u202egnp.exe"], "karpenter")
    mrkdwn = m["blocks"][1]["text"]["text"]
    for text in (m["text"], mrkdwn):
        assert "<" not in text and ">" not in text and "&lt;!channel&gt;" in text and " &amp; " in text
        assert "\u202e" not in text
    assert m["blocks"][1]["text"]["type"] == "mrkdwn"


def test_terminal_output_escapes_bidirectional_and_control_characters(tmp_path: Path) -> None:
    """Trojan Source (CVE-2021-42574, https://trojansource.codes): U+202A-U+202E and U+2066-U+2069
    reorder what a terminal shows; C0 and C1 controls drive it."""
    import io

    from sweeper.output import Col, Out

    out = Out.to("table", stream=io.StringIO())
    name = "gpu-01\u202e\u2066lanigiro\u2069\x1b[2J\x9b"
    out.table([Col("node")], [[name]])
    out.write(name)
    out.document({"node": name})
    text = out.file.getvalue()
    for ch in ("\u202e", "\u2066", "\u2069", "\x1b", "\x9b"):
        assert ch not in text, repr(ch)
    assert "\\u202e" in text
    yaml_out = Out.to("yaml", stream=io.StringIO())
    yaml_out.document({"node": name})
    assert "\u202e" not in yaml_out.file.getvalue()
    assert json.loads(text[text.index("{"):])["node"] == name, "the JSON document is the same data"
