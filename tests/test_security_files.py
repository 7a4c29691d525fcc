"""The files Sweeper writes for people are written beside their place and renamed into it
(sweeper.files.write_atomic): a symlink someone planted at a report page, at a cluster's page in the
output directory, or at an evidence bundle's path is replaced, never written through to its target.
rename(2) replaces a link at the new path rather than following it
(https://man7.org/linux/man-pages/man2/rename.2.html)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.files import write_atomic
from sweeper.history import History
from tests.test_report import T0, _sweep

VICTIM = "someone else's file\n"


def plant(link: Path, target: Path) -> None:
    target.write_text(VICTIM)
    link.symlink_to(target)


def test_write_atomic_replaces_a_link_and_leaves_its_target(tmp_path: Path) -> None:
    plant(tmp_path / "page.html", tmp_path / "victim")
    write_atomic(tmp_path / "page.html", "<html>")
    assert (tmp_path / "victim").read_text() == VICTIM
    assert not (tmp_path / "page.html").is_symlink() and (tmp_path / "page.html").read_text() == "<html>"
    assert sorted(os.listdir(tmp_path)) == ["page.html", "victim"], "no temporary file left"


def test_write_atomic_without_overwrite_leaves_any_existing_name_alone(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        write_atomic(tmp_path / "dangling", b"data", overwrite=False)
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "dangling").is_symlink()
    write_atomic(tmp_path / "new", b"data", overwrite=False, mode=0o600)
    assert (tmp_path / "new").read_bytes() == b"data" and (tmp_path / "new").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["dangling", "new"]


def test_the_report_replaces_a_link_at_its_output_and_never_writes_through_it(tmp_path: Path) -> None:
    h = History(tmp_path / "h.db")
    h.run_started("run-1", T0, "sweep")
    _sweep(h, "run-1", "gpu-00", T0, "pass", ecc=1.0)
    h.run_finished("run-1", T0 + 300, "done", 1, {"gpu_node_profiles": {"gpu-00": "p5.48xlarge"}})
    h.close()
    out = tmp_path / "out"
    out.mkdir()
    plant(out / "report.html", tmp_path / "victim")
    for args in (["--offline"], ["--node", "gpu-00"]):
        (out / "report.html").unlink()
        (out / "report.html").symlink_to(tmp_path / "victim")
        res = CliRunner().invoke(main, ["report", "--state", str(tmp_path / "h.db"), "--since", "3650d",
                                        "-o", str(out / "report.html"), *args])
        assert res.exit_code == 0, res.output
        assert (tmp_path / "victim").read_text() == VICTIM
        page = out / "report.html"
        assert not page.is_symlink() and page.is_file() and "gpu-00" in page.read_text()


def test_the_fleet_report_replaces_a_link_planted_at_a_clusters_page(tmp_path: Path) -> None:
    state = tmp_path / "fleet.db"
    for cluster in ("east", "west"):
        h = History(state, cluster=cluster)
        h.run_started(f"{cluster}-1", T0, "sweep")
        _sweep(h, f"{cluster}-1", "gpu-00", T0, "pass")
        h.run_finished(f"{cluster}-1", T0 + 300, "done", 1, {})
        h.close()
    out = tmp_path / "out"
    out.mkdir()
    plant(out / "fleet-east.html", tmp_path / "victim")
    res = CliRunner().invoke(main, ["report", "--offline", "--state", str(state), "--cluster", "all",
                                    "--since", "3650d", "-o", str(out / "fleet.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "victim").read_text() == VICTIM
    for name in ("fleet.html", "fleet-east.html", "fleet-west.html"):
        assert not (out / name).is_symlink() and (out / name).is_file(), name
    assert "east" in (out / "fleet-east.html").read_text()
    assert sorted(os.listdir(out)) == ["fleet-east.html", "fleet-west.html", "fleet.html"]
