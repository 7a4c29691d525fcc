"""`sweeper ingest`: read a tool's output produced outside Sweeper (a Slurm prolog, a manual
DCGM run) into the common result, and record it in the history."""

from __future__ import annotations

import time
from typing import Any

from sweeper.errors import ConfigError
from sweeper.parsers import dcgm, nccl, sweeper_result
from sweeper.parsers.kernel_log import parse_xids
from sweeper.result import CheckResult, Result
from sweeper.xid import lookup

FORMATS = ("auto", "dcgm", "nccl", "kernel-log", "sweeper")


def detect(text: str) -> str:
    head = text[:200_000]
    if '"DCGM Diagnostic"' in head or '"DCGM GPU Diagnostic"' in head or '"iterations"' in head:
        return "dcgm"
    if "sweeper.dev/result/" in head:
        return "sweeper"
    if "Avg bus bandwidth" in head or "nccl-tests" in head or "all_reduce_perf" in head:
        return "nccl"
    if "NVRM: Xid" in head or "SXid" in head or "kernel:" in head:
        return "kernel-log"
    raise ConfigError("cannot tell the format of this file; pass --format "
                      + "|".join(f for f in FORMATS if f != "auto"))


def kernel_log(text: str, node: str, now: float) -> Result:
    """XIDs in a kernel log (dmesg or journal), judged by the catalogue."""
    events = parse_xids(text)
    if not events:
        return Result(node=node, source="kernel-log", started=now, finished=now,
                      checks=(CheckResult("xid", "pass", "no XID in the log"),))
    checks = []
    for e in events:
        info = lookup(e.code)
        status = {"ignore": "pass", "restart_app": "warn"}.get(info.action, "fail")
        if e.code == 154 and e.recovery_action:
            status = "pass" if e.recovery_action.lower() == "none" else "fail"
        checks.append(CheckResult("xid", status, f"XID {e.code} ({info.meaning}) on {e.pci}; action: "
                                  f"{e.recovery_action or info.action}", info.severity, code=str(e.code)))
    return Result(node=node, source="kernel-log", started=now, finished=now, checks=tuple(checks))


def ingest(text: str, node: str, fmt: str, now: float | None = None, **options: Any) -> tuple[str, Result]:
    now = time.time() if now is None else now
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect(text)
    if fmt == "dcgm":
        return fmt, dcgm.parse(text, node, now, exit_code=options.get("exit_code"),
                               expect_gpus=options.get("expect_gpus"))
    if fmt == "nccl":
        return fmt, nccl.parse(text, node, now, min_busbw=options.get("min_busbw"), exit_code=options.get("exit_code"))
    if fmt == "kernel-log":
        return fmt, kernel_log(text, node, now)
    return fmt, sweeper_result.parse(text, node, now)
