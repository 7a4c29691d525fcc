"""Many clusters on one history (issue 26): `nodes`, `history`, `report` and `backtest` take
`--cluster NAME|all`; a node is keyed by (cluster, node), since names repeat across clusters; the
report's fleet page has a row per cluster, escaped; the config's `state` key sits between
$SWEEPER_STATE and the default, and a URL's password is never printed. Each runs on SQLite and on a
real PostgreSQL server (tests/history_backends.py)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.cli.options import shown
from sweeper.history import History
from sweeper.result import CheckResult, Result

DAY = 86400.0
# The runs begin 30 and a half days from now and `--since 0d` reads from now, so the report's window
# always holds them all and ends at the fleet's last run, and no day of it starts near a run. A fixed
# T0 (1_800_000_000, 2027-01-15) read with `--since 0d` would have found no run at all from that date on.
T0 = float(int(time.time())) + 30.5 * DAY
EVIL = '<script>alert(1)</script>"/../x'


def _sweeps(h: History, days: int, nodes: int, failing: dict[str, str]) -> None:
    """A run a day, each sweeping `nodes` nodes (`gpu-00`...); `failing`: node -> the verdict it gets
    every day from the last three days on (the others pass)."""
    for d in range(days):
        at = T0 + d * DAY
        run = f"{h.cluster[:8]}-{d}"
        h.run_started(run, at, "sweep")
        for i in range(nodes):
            node = f"gpu-{i:02d}"
            verdict = failing.get(node, "pass") if d >= days - 3 else "pass"
            sid = h.sweep_started(run, node, at + i, "sweep-light.yaml", "p5.48xlarge")
            h.result(sid, Result(node=node, source="sweeper", started=at, finished=at + i + 30,
                                 checks=(CheckResult("xid", "fail" if verdict != "pass" else "pass", code="79",
                                                     message=f"{h.cluster} {node}"),)))
            h.sweep_finished(sid, at + i + 60, verdict, [f"{h.cluster} {node} {verdict}"],
                             {"causes": ["xid|79"] if verdict != "pass" else [], "rules": [], "decided": at + i + 60,
                              "policy": "default", "verdict": verdict})
        h.run_finished(run, at + 3600, "done", nodes, {})


@pytest.fixture
def shared(new_state: Callable[[str], str]) -> str:
    """One store, three clusters with the same node names: `east` (gpu-01 replaced), `west` (gpu-02
    rebooted) and one whose name is markup and a path."""
    state = new_state("fleet.db")
    for name, failing, days in (("east", {"gpu-01": "replace"}, 20), ("west", {"gpu-02": "reboot"}, 5),
                                (EVIL, {}, 3)):
        h = History(state, cluster=name)
        _sweeps(h, days, 4, failing)
        h.close()
    return state


def test_the_overview_counts_each_cluster_on_its_own(shared: str) -> None:
    h = History(shared, cluster="east")
    rows = {r["cluster"]: r for r in h.cluster_overview(0.0, ("reboot", "replace", "quarantine"))}
    assert sorted(rows) == sorted(["east", "west", EVIL])
    assert (rows["east"]["nodes"], rows["east"]["held"], rows["east"]["failures"]) == (4, 1, 3)
    assert (rows["west"]["nodes"], rows["west"]["held"], rows["west"]["failures"]) == (4, 1, 3)
    assert (rows[EVIL]["held"], rows[EVIL]["failures"]) == (0, 0)
    assert rows["east"]["last_run"] == T0 + 19 * DAY and rows["east"]["last_status"] == "done"
    # a node is its cluster's: the same name in each cluster is a different node
    assert h.for_cluster(None).node_clusters("gpu-01") == sorted(["east", "west", EVIL])
    assert [s["verdict"] for s in h.for_cluster("west").node_history("gpu-01")["sweeps"]] == ["pass"] * 5
    assert {s["cluster"] for s in h.for_cluster(None).node_history("gpu-02")["sweeps"]} == {"east", "west", EVIL}
    h.close()


def test_a_failure_late_in_a_day_counts_on_that_day_on_either_backend(new_state: Callable[[str], str]) -> None:
    """The fleet page's daily failures (its trend and spark line): a failure 18 hours into the window's
    first day is on day 0. PostgreSQL's cast of a float to integer rounds (to day 1), SQLite's truncates."""
    h = History(new_state("late.db"), cluster="east")
    h.run_started("r", T0, "sweep")
    for node, hours in (("gpu-00", 18.0), ("gpu-01", 36.0)):
        sid = h.sweep_started("r", node, T0 + hours * 3600, "sweep-light.yaml", "p5.48xlarge")
        h.sweep_finished(sid, T0 + hours * 3600 + 60, "reboot", ["xid (GPU 3): XID 79"])
    h.run_finished("r", T0 + 40 * 3600, "done", 2, {})
    [row] = h.cluster_overview(T0, ("reboot", "replace", "quarantine"))
    h.close()
    assert row["daily"] == {0: 1, 1: 1}, row


def _run(*argv: str, env: dict[str, str] | None = None) -> object:
    return CliRunner().invoke(main, list(argv), env=env, catch_exceptions=False)


def test_nodes_reads_one_cluster_or_all_with_a_cluster_column(shared: str) -> None:
    res = _run("nodes", "--offline", "--state", shared, "--cluster", "all", "-o", "json")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    rows = json.loads(res.output)["nodes"]  # type: ignore[attr-defined]
    assert len(rows) == 12 and {(r["cluster"], r["node"]) for r in rows if r["verdict"] != "pass"} == \
        {("east", "gpu-01"), ("west", "gpu-02")}
    table = _run("nodes", "--offline", "--state", shared, "--cluster", "*").output  # type: ignore[attr-defined]
    assert table.splitlines()[1].split()[:2] == ["CLUSTER", "NODE"]
    one = json.loads(_run("nodes", "--offline", "--state", shared, "--cluster", "west",  # type: ignore[attr-defined]
                          "-o", "json").output)["nodes"]
    assert [(r["node"], r["verdict"]) for r in one] == [("gpu-00", "pass"), ("gpu-01", "pass"),
                                                        ("gpu-02", "reboot"), ("gpu-03", "pass")]
    assert all("cluster" not in r for r in one)
    bad = CliRunner().invoke(main, ["nodes", "--offline", "--state", shared, "--cluster", "north"])
    assert bad.exit_code == 2 and "no cluster 'north'" in bad.output and "east" in bad.output


def test_the_default_is_the_config_s_cluster_name(shared: str, tmp_path: Path) -> None:
    """One-cluster users see no change: without --cluster, the config's cluster_name is read alone."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("cluster_name: west\n")
    rows = json.loads(_run("nodes", "--offline", "--state", shared, "--config", str(cfg),  # type: ignore[attr-defined]
                           "-o", "json").output)["nodes"]
    assert [r["verdict"] for r in rows] == ["pass", "pass", "reboot", "pass"] and all("cluster" not in r for r in rows)


def test_history_of_a_node_named_in_several_clusters_needs_the_cluster(shared: str) -> None:
    res = CliRunner().invoke(main, ["history", "gpu-01", "--state", shared, "--cluster", "all"])
    assert res.exit_code == 2 and "--cluster" in res.output and "east" in res.output
    doc = json.loads(_run("history", "gpu-01", "--state", shared, "--cluster", "east",  # type: ignore[attr-defined]
                          "-o", "json").output)
    assert doc["cluster"] == "east" and doc["sweeps"][0]["verdict"] == "replace"
    assert all(s["cluster"] == "east" for s in doc["sweeps"]) and len(doc["sweeps"]) == 20


def test_the_fleet_page_has_a_row_per_cluster_escaped_and_links_to_each(shared: str, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    res = _run("report", "--offline", "--state", shared, "--cluster", "all", "-o", str(out), "--since", "0d")
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    page = out.read_text()
    assert "<script" not in page and "&lt;script&gt;" in page
    rows = dict(re.findall(r'<tr data-cluster="([^"]*)"><td><a href="([^"]+)"', page))
    assert set(rows) == {"east", "west", "&lt;script&gt;alert(1)&lt;/script&gt;&quot;/../x"}
    for href in rows.values():  # each link is a file beside the fleet page, never a path elsewhere
        assert "/" not in href and (tmp_path / href).is_file()
    assert "gpu-01" in (tmp_path / rows["east"]).read_text()
    east = re.search(r'data-cluster="east">(.*?)</tr>', page).group(1)  # type: ignore[union-attr]
    # 3 failures of 4 nodes over the 19 days from its first sweep to the fleet's latest run; all 3 in
    # the last week, none the week before
    nodes, held, failures, rate = re.findall(r"<td>([0-9.]+)</td>", east)[:4]
    assert (nodes, held, failures) == ("4", "1", "3") and float(rate) == pytest.approx(3 / (4 * 19.04), abs=1e-3)
    assert 'data-trend="rising"' in east
    west = re.search(r'data-cluster="west">(.*?)</tr>', page).group(1)  # type: ignore[union-attr]
    assert 'data-trend="steady"' in west  # its 3 failures are older than two weeks before the fleet's last run
    stdout = CliRunner().invoke(main, ["report", "--offline", "--state", shared, "--cluster", "all", "-o", "-"])
    assert stdout.exit_code == 2 and "-o" in stdout.output


def test_backtest_replays_each_cluster_on_its_own_rows(shared: str) -> None:
    doc = json.loads(_run("backtest", "--state", shared, "--cluster", "all", "--policy",  # type: ignore[attr-defined]
                          "default.yaml", "--since", "0d", "-o", "json").output)
    held = {(d["cluster"], d["node"]) for d in doc["decisions"] if d["recorded"] in ("reboot", "replace")}
    assert held == {("east", "gpu-01"), ("west", "gpu-02")}
    assert doc["sweeps"] == 4 * (20 + 5 + 3)
    west = json.loads(_run("backtest", "--state", shared, "--cluster", "west", "--policy",  # type: ignore[attr-defined]
                           "default.yaml", "--since", "0d", "-o", "json").output)
    assert west["sweeps"] == 20 and all("cluster" not in d for d in west["decisions"])


def test_the_state_key_comes_after_the_flag_and_the_environment(tmp_path: Path) -> None:
    """--state > $SWEEPER_STATE > the config's `state` > state/<context>.db."""
    paths = {k: tmp_path / f"{k}.db" for k in ("flag", "env", "config")}
    for k, p in paths.items():
        h = History(str(p), cluster=k)
        _sweeps(h, 1, 1, {})
        h.close()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"state: {paths['config']}\n")

    def cluster_read(*extra: str, env: dict[str, str] | None = None) -> str:
        res = _run("nodes", "--offline", "--config", str(cfg), "--cluster", "all", "-o", "json", *extra, env=env)
        return json.loads(res.output)["nodes"][0]["cluster"]  # type: ignore[attr-defined]

    assert cluster_read() == "config"
    assert cluster_read(env={"SWEEPER_STATE": str(paths["env"])}) == "env"
    assert cluster_read("--state", str(paths["flag"]), env={"SWEEPER_STATE": str(paths["env"])}) == "flag"


def test_a_url_password_is_never_printed() -> None:
    """In the config's `state` (or anywhere a command names its history): the error says where,
    with the password masked."""
    assert shown("postgresql://sweeper:s3cr%40t@db.example:5432/h") == "postgresql://sweeper:***@db.example:5432/h"
    assert shown("postgresql+psycopg://u:p@h/d?sslmode=require") == "postgresql+psycopg://u:***@h/d?sslmode=require"
    assert shown("state/a:b@c.db") == "state/a:b@c.db" and shown("postgresql://u@h/d") == "postgresql://u@h/d"


@pytest.mark.parametrize("url", [
    "postgresql://sweeper:ab/cd@127.0.0.1:1/h",  # SQLAlchemy's password is everything up to the first `@`
    "postgresql://sweeper:ab:c/d?e@127.0.0.1:1/h",
    "postgresql://sweeper@127.0.0.1:1/h?password=ab%2Fcd",  # libpq takes any parameter in the query
    "postgresql://sweeper@127.0.0.1:1/h?sslmode=disable&pass%77ord=ab%2Fcd",  # its key percent-encoded
    "postgresql:///h?host=127.0.0.1&port=1&user=sweeper&sslpassword=ab%2Fcd",
])
def test_a_url_password_is_masked_wherever_the_url_holds_it(url: str) -> None:
    """The config's `state` is read by SQLAlchemy (its URL's password: the text between `user:` and the
    first `@`, slashes included) and by libpq (a password in the query,
    https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING-URIS): every message
    that names the history masks it, and the command that fails to connect says so without it."""
    from sweeper.history import redact

    for text in (shown(url), redact(url)):
        assert "ab" not in text.replace("sslmode", "").replace("disable", ""), text
        assert "***" in text
    res = CliRunner().invoke(main, ["history", "gpu-01", "--state", url, "-o", "json"])
    assert res.exit_code == 3, res.output
    assert "ab/cd" not in res.output and "ab%2Fcd" not in res.output and "***" in res.output


def test_the_config_state_url_is_masked_in_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("state: postgresql://sweeper:hunter2@127.0.0.1:1/sweeper\n")
    res = CliRunner().invoke(main, ["history", "gpu-01", "--config", str(cfg)], env={"SWEEPER_STATE": ""})
    assert res.exit_code == 3 and "hunter2" not in res.output and "sweeper:***@127.0.0.1:1" in res.output
    assert "hunter2" not in CliRunner().invoke(main, ["history", "--help"]).output


@pytest.mark.slow
def test_two_demos_share_one_postgresql_history_and_one_fleet_report(postgres_database: str,
                                                                      tmp_path: Path) -> None:
    """The issue's check: `sweeper demo` twice into one PostgreSQL database under two cluster names,
    then `sweeper report --cluster all` shows both (each with its own page)."""
    from tests.history_backends import fresh_schema

    url = fresh_schema(postgres_database)
    for name in ("east", "west"):
        res = _run("demo", "--cycles", "1", "--state", url, "--cluster-name", name,
                   "--report", str(tmp_path / f"demo-{name}.html"))
        assert res.exit_code == 0, res.output[-2000:]  # type: ignore[attr-defined]
    res = _run("report", "--offline", "--state", url, "--cluster", "all", "-o", str(tmp_path / "fleet.html"))
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    page = (tmp_path / "fleet.html").read_text()
    assert dict(re.findall(r'<tr data-cluster="([^"]*)"><td><a href="([^"]+)"', page)) == {
        "east": "fleet-east.html", "west": "fleet-west.html"}
    for name in ("east", "west"):
        assert "gpu-p5-00" in (tmp_path / f"fleet-{name}.html").read_text()
    both = json.loads(_run("nodes", "--offline", "--state", url, "--cluster", "all",  # type: ignore[attr-defined]
                           "-o", "json").output)["nodes"]
    assert {r["cluster"] for r in both} == {"east", "west"}


def test_the_last_day_of_the_trend_is_the_day_that_ends_now() -> None:
    """A 30-day window: the spark line's last point and the trend's week end at `now`. Counted from
    `since`, day 30 begins at `now` itself; it was taken for today, so the spark line always ended
    at 0 and a failure an hour ago was in neither week's count."""
    from sweeper.report.fleet import TREND_DAYS, overview

    now, day = 1_900_000_000.0, 86400.0
    since = now - 30 * day
    ago = {"hour": now - 3600, "six days": now - 6.5 * day, "eight days": now - 7.5 * day}

    class Rows:
        def cluster_overview(self, since_: float, failing: tuple[str, ...]) -> list[dict[str, object]]:
            daily: dict[int, int] = {}
            for t in ago.values():
                d = int((t - since_) // day)
                daily[d] = daily.get(d, 0) + 1
            return [{"cluster": "east", "nodes": 4, "held": 1, "failures": 3, "first": since_, "daily": daily,
                     "last_run": now - 60, "last_status": "done"}]

    [row] = overview(Rows(), since, now)
    assert row["spark"][-1] == 1 and len(row["spark"]) == 2 * TREND_DAYS
    assert (row["recent"], row["before"]) == (2, 1)
