"""The formats of a tool's output that Sweeper reads, and the one reader of each: `sweeper
ingest` and `run_job`'s `parser` both take this list and call `read`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from sweeper.errors import ConfigError
from sweeper.result import Result

# Each reader is imported when a text is read, not with this list: `sweeper ingest --format` and
# `run_job`'s `parser` name the formats at start-up, and a sweep's checks report in Sweeper's own
# format, so a command that reads no other (every sweep, `history`) does not import them all.
FORMATS = ("auto", "dcgm", "nccl", "kernel-log", "sweeper", "nvidia-smi", "ibv-devinfo", "topo", "fi-info", "ping")


def detect(text: str) -> str:
    """The format of `text`, from what each format's own lines look like (terminal escapes taken off)."""
    from sweeper.parsers import dcgm, fi_info, ibv_devinfo, nccl, nvidia_smi, ping, topo
    from sweeper.parsers import kernel_log as kernel_log_format
    from sweeper.parsers.paste import strip_escapes

    head = strip_escapes(text[:200_000])
    if '"DCGM Diagnostic"' in head or '"DCGM GPU Diagnostic"' in head or '"iterations"' in head:
        return "dcgm"
    if "sweeper.dev/result/" in head:
        return "sweeper"
    if nccl.looks_like(head):
        return "nccl"
    if dcgm.looks_like_table(head):
        return "dcgm"
    if "kernel:" in head or kernel_log_format.looks_like(head):
        return "kernel-log"
    if topo.looks_like(head):  # before nvidia-smi: `nvidia-smi topo -m` is nvidia-smi output too
        return "topo"
    if nvidia_smi.looks_like(head):  # -q (whole or one section), CSV queries, pasted or not
        return "nvidia-smi"
    if ibv_devinfo.looks_like(head):  # whole, grep-filtered, ibstat, ibstatus
        return "ibv-devinfo"
    if fi_info.looks_like(head):
        return "fi-info"
    if ping.looks_like(head):
        return "ping"
    raise ConfigError("cannot tell the format of this file; pass --format "
                      + "|".join(f for f in FORMATS if f != "auto"))


def kernel_log(text: str | Iterable[str], node: str, now: float) -> Result:
    """XIDs and lost GPUs in a kernel log (dmesg, journal or syslog), judged as `sweeper check`
    judges them."""
    from sweeper.xid import judge_kernel_log

    checks, metrics = judge_kernel_log(text)
    return Result(node=node, source="kernel-log", started=now, finished=now, checks=tuple(checks),
                  metrics=tuple(metrics))


def read(text: str, node: str, fmt: str, now: float | None = None, **options: Any) -> tuple[str, Result]:
    """The result of `text` read as `fmt` (`auto`: detected), and the format it was read as."""
    from sweeper.parsers import dcgm, fi_info, ibv_devinfo, nccl, nvidia_smi, ping, sweeper_result, topo
    from sweeper.parsers.paste import strip_escapes

    now = time.time() if now is None else now
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
    text = strip_escapes(text)  # every reader sees the text, not the terminal's underline or colour
    if fmt == "auto":
        fmt = detect(text)
    if fmt == "dcgm":
        return fmt, dcgm.parse(text, node, now, exit_code=options.get("exit_code"),
                               expect_gpus=options.get("expect_gpus"))
    if fmt == "nccl":
        return fmt, nccl.parse(text, node, now, min_busbw=options.get("min_busbw"), exit_code=options.get("exit_code"))
    if fmt == "kernel-log":
        return fmt, kernel_log(text, node, now)
    if fmt == "nvidia-smi":
        return fmt, nvidia_smi.parse(text, node, now, expect_gpus=options.get("expect_gpus"),
                                     gpu_model=options.get("gpu_model") or "",
                                     thermal_margin_min=options.get("thermal_margin_min"))
    if fmt == "ibv-devinfo":
        return fmt, ibv_devinfo.parse(text, node, now, expect=options.get("expect_nics"),
                                      kind=options.get("nic") or "")
    if fmt == "fi-info":
        return fmt, fi_info.parse(text, node, now, expect=options.get("expect_nics"),
                                  exit_code=options.get("exit_code"))
    if fmt == "ping":
        return fmt, ping.parse(text, node, now, mtu=options.get("mtu"), exit_code=options.get("exit_code"))
    if fmt == "topo":
        return fmt, topo.parse(text, node, now, nvlinks=options.get("nvlinks"),
                               nic_affinity=options.get("nic_affinity") or "")
    return fmt, sweeper_result.parse(text, node, now)
