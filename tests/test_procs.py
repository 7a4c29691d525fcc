"""tests.procs: a `sweeper` command forked from the pre-imported zygote behaves as a process of its
own started by subprocess: exit code, stdout and stderr, environment, working directory, signals."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests import procs


def test_exit_code_output_environment_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ok = procs.run(["--version"], timeout=60)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "sweeper, version 0.1.0\n", "")
    bad = procs.run(["no-such-command"], timeout=60)
    assert bad.returncode == 2 and "No such command 'no-such-command'" in bad.stderr and bad.stdout == ""
    # the caller's environment and directory at the start, not the zygote's from its own start
    monkeypatch.setenv("KUBECONFIG", "missing.kubeconfig")
    res = procs.run(["plan", "--state", "h.db"], cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "no kubeconfig at missing.kubeconfig" in res.stderr
    with (tmp_path / "err").open("wb") as sink:
        proc = procs.start(["plan", "--kubeconfig", "missing"], stdout=procs.DEVNULL, stderr=sink)
    assert proc.pid != os.getpid() and proc.wait(60) == 2
    assert "no kubeconfig at missing" in (tmp_path / "err").read_text()


def test_signals_reach_a_real_process(tmp_path: Path) -> None:
    """`sweeper sim serve` stops on SIGTERM by its own handler (exit 0); SIGKILL leaves -9."""
    for sig, code in ((signal.SIGTERM, 0), (signal.SIGKILL, -9)):
        kc = tmp_path / f"kc-{sig}"
        proc = procs.start(["sim", "serve", "--port", "0", "--kubeconfig-out", str(kc)], stdout=procs.PIPE,
                           stderr=procs.STDOUT)
        deadline = time.monotonic() + 60
        while not kc.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kc.exists(), proc.communicate(1)
        proc.send_signal(sig)
        assert proc.wait(60) == code
        proc.communicate()
