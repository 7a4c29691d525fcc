"""Node-local health checks: what `sweeper check` runs inside a Job on the node.

The checks talk to NVML through whatever module is handed to them: the real `pynvml`
bindings on a GPU node, or `checks.fake.FakeNvml` in the simulated cluster. A counter the
GPU does not support is `skip` with a reason; a library or log that cannot be read is
`error`; nothing is a pass without a reading.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

from sweeper.checks.collect import Collector
from sweeper.checks.fabric import nic_checks
from sweeper.checks.gpu import gpu_checks
from sweeper.checks.host import JOURNAL_DIRS, Host
from sweeper.checks.options import CheckOptions
from sweeper.checks.uccl import uccl_checks
from sweeper.result import BOOT_TIME, Result
from sweeper.xid import judge_kernel_log


def read_kernel_log(opts: CheckOptions) -> tuple[str | None, str]:
    """The kernel log text, or None and why it could not be read."""
    if opts.skip_kernel_log:
        return None, opts.skip_kernel_log
    if opts.kernel_log:
        try:
            return Path(opts.kernel_log).read_text(errors="replace"), ""
        except OSError as exc:
            return None, f"cannot read {opts.kernel_log}: {exc}"
    try:
        proc = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run dmesg: {exc}"
    if proc.returncode != 0:
        return None, f"dmesg exited {proc.returncode}: {proc.stderr.strip()[:200]}"
    return proc.stdout, ""


_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")
JOURNAL_CHECK = "xid.journal"  # the journal could not be read (the ring buffer alone was judged)


def read_journal(host: Host, window: float) -> tuple[str | None, str]:
    """The kernel's lines of this boot from the host's journal, as `dmesg` stamps them (seconds since
    boot), and why what was read is short ("" when nothing is missing). The ring buffer is a few MiB
    that a noisy driver overwrites within hours; journald keeps what it read from /dev/kmsg, so an XID
    the ring buffer lost inside the window is still there. The image's journalctl reads the journal
    directories mounted under the host root (`--root`: /var/log/journal and /run/log/journal below
    it), and `-b` takes the running kernel's boot ID, since the journal's last boot need not be this
    one. A journal written by a newer systemd may be unreadable to the image's journalctl: journalctl
    skips such a file with a warning, which is reported, never read as a clean journal.
    https://www.freedesktop.org/software/systemd/man/latest/journalctl.html"""
    if not any(host.listdir(d) for d in JOURNAL_DIRS):
        return None, f"the host keeps no journal files in {' or '.join(JOURNAL_DIRS)}"
    boot = host.boot_id()
    if boot is None:
        return None, "the kernel's boot ID is unreadable"
    argv = ["journalctl", f"--root={host.resolve('/')}", "-k", "-b", boot, "-o", "short-monotonic", "--no-pager", "-q",
            f"--since=-{max(1, int(window))}s"]
    try:
        code, out, err = host.run(argv, timeout=60)
    except FileNotFoundError:
        return None, "journalctl is not in the check image"
    problem = _journal_problem(err)
    if code != 0:
        return None, f"journalctl exited {code}: {problem or (err or out).strip()[:160]}"
    return out, problem


def _journal_problem(err: str) -> str:
    """What journalctl said about files it could not read (a newer format, corruption), in a line."""
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    unsupported = [ln for ln in lines if "unsupported feature" in ln]
    if unsupported:
        return (f"{len(unsupported)} journal file(s) use a format newer than the image's journalctl reads "
                f"({unsupported[0][:120]})")
    skipped = [ln for ln in lines if "ignoring file" in ln]
    if skipped:
        return f"{len(skipped)} journal file(s) skipped ({skipped[0][:120]})"
    return ""


def merge_kernel_logs(ring: str, journal: str) -> str:
    """The ring buffer, preceded by the journal's kernel lines older than its oldest line: the same
    event is never counted twice, and what the ring buffer lost comes back."""
    oldest = next((float(m.group(1)) for m in map(_STAMP.match, ring.splitlines()) if m), None)
    older = [ln for ln in journal.splitlines()
             if (m := _STAMP.match(ln)) and (oldest is None or float(m.group(1)) < oldest)]
    return "\n".join(older + [ring]) if older else ring


def system_uptime() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def run_node_checks(opts: CheckOptions, nvml: Any, kernel_log: str | None, *, now: float,
                    uptime: float | None = None, kernel_log_error: str = "", host: Host | None = None) -> Result:
    """Every node-local check, as one result document. Without a host, only NVML and the
    kernel log are read (the fabric and UCCL checks need sysfs and commands)."""
    c = Collector()
    bus_to_gpu = gpu_checks(opts, nvml, c, uptime)
    if host is not None and kernel_log is not None and not opts.skip_kernel_log and not opts.kernel_log:
        journal, why = read_journal(host, opts.xid_window)
        if journal:
            kernel_log = merge_kernel_logs(kernel_log, journal)
        if why:  # the ring buffer is still judged; what it may have lost is said, never passed over
            c.check(JOURNAL_CHECK, "skip", f"the journal's kernel lines {'partly ' if journal is not None else ''}"
                    f"unread: {why}; an XID only the journal kept may be missed", "warning")
    _xid_checks(opts, kernel_log, kernel_log_error, uptime, bus_to_gpu, c, now)
    if uptime is not None:  # when this boot began: the kernel log read covers no earlier time
        c.metric(BOOT_TIME, round(now - uptime, 1), "s")
    if host is not None:
        nic_checks(opts, host, c)
        if opts.uccl:
            uccl_checks(opts, host, c, len(bus_to_gpu))
    return Result(node=opts.node, source="sweeper-check", started=now, finished=now,
                  checks=tuple(c.checks), metrics=tuple(c.metrics), facts=tuple(c.facts.items()))


def _xid_checks(opts: CheckOptions, kernel_log: str | None, why: str, uptime: float | None,
                bus_to_gpu: dict[str, int], c: Collector, now: float | None = None) -> None:
    if opts.skip_kernel_log:  # asked not to read it (an unprivileged check): never a pass
        c.check("xid", "skip", f"kernel log not read: {opts.skip_kernel_log}")
        return
    if kernel_log is None:
        c.check("xid", "error", f"kernel log unreadable: {why}", "critical")
        return
    since = xid_since(opts, uptime, now)
    checks, metrics = judge_kernel_log(kernel_log, bus_to_gpu, since=since)
    c.checks.extend(checks)
    c.metrics.extend(metrics)


def xid_since(opts: CheckOptions, uptime: float | None, now: float | None) -> float | None:
    """The uptime before which XIDs are left out: the window's start, or the node's last passing
    sweep or GPU reset (`--xid-since`, wall-clock) where that is later."""
    if uptime is None:
        return None
    since = uptime - opts.xid_window
    if opts.xid_since > 0 and now is not None:
        since = max(since, uptime - (now - opts.xid_since))
    return since

