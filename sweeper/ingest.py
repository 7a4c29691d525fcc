"""`sweeper ingest`: read a tool's output produced outside Sweeper (a Slurm prolog, a manual
DCGM run) into the common result, and record it in the history."""

from __future__ import annotations

import codecs
import difflib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from sweeper.formats import FORMATS, detect, kernel_log, read
from sweeper.parsers.kernel_log import MAX_LINE
from sweeper.parsers.paste import strip_escapes
from sweeper.result import CheckResult, Result

__all__ = ["FORMATS", "detect", "ingest", "ingest_stream", "kernel_log", "known_node"]

MAX_INPUT = 64 * 1024 * 1024  # what is read of a file whose format cannot be streamed
HEAD = 256 * 1024  # what format detection looks at


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
        yield from (strip_escapes(line[:MAX_LINE]) for line in done)
        if len(pending) > MAX_LINE:
            yield strip_escapes(pending[:MAX_LINE])
            pending, skipping = "", True
    pending += decoder.decode(b"", final=True)
    if pending and not skipping:
        yield strip_escapes(pending[:MAX_LINE])


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
    """`text` read as `fmt` (the shared reader of every format)."""
    return read(text, node, fmt, now, **options)


def expectations(profile: Any) -> dict[str, Any]:
    """What a hardware profile expects of a tool's output (GPU count and model, NVLinks, NICs, the
    NCCL floor), as the options of `ingest`."""
    return {"expect_gpus": profile.gpus, "gpu_model": profile.gpu_model, "nvlinks": profile.nvlinks,
            "nic": profile.nic, "expect_nics": profile.nics if profile.nic in ("efa", "ib") else None,
            "nic_affinity": profile.nic_affinity, "min_busbw": profile.nccl_busbw_min,
            "thermal_margin_min": profile.thermal_margin_min}


def known_node(node: str, history: Any, cluster_nodes: Callable[[], list[str]], where: str) -> None:
    """Whether a result may be recorded under `node`: a node the history knows (one that left the
    cluster included), else one the cluster has. A name neither knows (a typo of gpu-p5-04) is bad
    input naming the closest of both, and `--new-node` to record it anyway. Where the cluster cannot
    be asked, the history alone decides, and the refusal says so."""
    from sweeper.errors import ConfigError, SweeperError

    if history.knows(node):
        return
    try:
        names, why = cluster_nodes(), ""
    except SweeperError as exc:
        names, why = [], str(exc)
    if node in names:
        return
    recorded = [n for n in history.node_names() if n != "*"]  # "*": an action on every node (a pause)
    close = difflib.get_close_matches(node, sorted({*names, *recorded}), n=3)
    asked = (f"the cluster could not be asked ({why}), and {where} has never seen it" if why
             else f"neither the cluster nor {where} knows it")
    raise ConfigError(f"no node {node!r}: {asked}" + (f"; did you mean {', '.join(close)}?" if close else "")
                      + " (--new-node records it anyway)")


def record(history: Any, node: str, found: str, result: Result, source: str) -> None:
    """Record an ingested result in the history as a run of its own with one sweep of kind `ingest`."""
    from sweeper.sweep import new_run_id

    run_id = new_run_id(time.time())
    history.run_started(run_id, time.time(), "ingest")
    sid = history.sweep_started(run_id, node, result.started, f"ingest:{found}", "", kind="ingest")
    history.result(sid, result)
    history.sweep_finished(sid, time.time(), result.status,
                           [f"{c.name}: {c.message}" for c in result.failed_checks])
    history.run_finished(run_id, time.time(), "done", 0, {"ingested": source, "format": found})
