"""`sweeper ingest`: read a tool's output produced outside Sweeper (a Slurm prolog, a manual
DCGM run) into the common result, and record it in the history."""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from sweeper.errors import ConfigError
from sweeper.parsers import dcgm, fi_info, ibv_devinfo, nccl, nvidia_smi, ping, sweeper_result, topo
from sweeper.parsers import kernel_log as kernel_log_format
from sweeper.parsers.kernel_log import MAX_LINE
from sweeper.result import CheckResult, Result
from sweeper.xid import judge_kernel_log

FORMATS = ("auto", "dcgm", "nccl", "kernel-log", "sweeper", "nvidia-smi", "ibv-devinfo", "topo", "fi-info", "ping")
MAX_INPUT = 64 * 1024 * 1024  # what is read of a file whose format cannot be streamed
HEAD = 256 * 1024  # what format detection looks at


def detect(text: str) -> str:
    head = text[:200_000]
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
    checks, metrics = judge_kernel_log(text)
    return Result(node=node, source="kernel-log", started=now, finished=now, checks=tuple(checks),
                  metrics=tuple(metrics))


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Decoded lines of a byte stream, each cut at MAX_LINE characters, holding at most one
    line (and one chunk) in memory."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    skipping = False  # inside a line already cut: drop what comes until its end
    for chunk in chunks:
        text = decoder.decode(chunk)
        if skipping:
            nl = text.find("\n")
            if nl < 0:
                continue
            text, skipping = text[nl + 1:], False
        pending += text
        *done, pending = pending.split("\n")
        yield from (line[:MAX_LINE] for line in done)
        if len(pending) > MAX_LINE:
            yield pending[:MAX_LINE]
            pending, skipping = "", True
    pending += decoder.decode(b"", final=True)
    if pending and not skipping:
        yield pending[:MAX_LINE]


def ingest_stream(stream: BinaryIO, node: str, fmt: str, now: float | None = None,
                  limit: int = MAX_INPUT, **options: Any) -> tuple[str, Result]:
    """`ingest` of a file or stdin without holding it all: a kernel log is streamed line by line
    whatever its size; any other format is read up to `limit` bytes, and the result then says
    that the input was cut."""
    now = time.time() if now is None else now
    head = stream.read(HEAD)
    if fmt == "auto":
        fmt = detect(head.decode("utf-8", errors="replace"))
    if fmt == "kernel-log":
        chunks = iter(lambda: stream.read(1024 * 1024), b"")
        return fmt, kernel_log(_lines(_chain(head, chunks)), node, now)
    data = head + stream.read(max(0, limit - len(head)) + 1)
    cut = len(data) > limit
    found, result = ingest(data[:limit].decode("utf-8", errors="replace"), node, fmt, now, **options)
    if cut:
        note = CheckResult("ingest.input", "warn", f"the input is longer than {limit} bytes: only the first "
                           f"{limit} were read", "warning", code="INPUT_CUT")
        result = Result(result.node, result.source, result.started, result.finished, result.checks + (note,),
                        result.metrics)
    return found, result


def _chain(first: bytes, rest: Iterable[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


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
    if fmt == "nvidia-smi":
        return fmt, nvidia_smi.parse(text, node, now, expect_gpus=options.get("expect_gpus"),
                                     gpu_model=options.get("gpu_model") or "")
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
