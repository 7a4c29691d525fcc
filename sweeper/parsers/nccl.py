"""nccl-tests output (all_reduce_perf and friends): the table, the footer, and the bus
bandwidth of the largest message, which is what a gate should use. Read as people paste it:
each line behind mpirun's rank tag (`[1,0]<stdout>:`) or a host name, indented, rows elided
with `...`, or a run that died on a CUDA or NCCL failure before its table."""

from __future__ import annotations

import re

from sweeper.result import CheckResult, Metric, Result, error_result

_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:\s|\d{4}-\d\d-\d\dT[\d:.]+Z?\s+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([\d.eE+-]+)\s*(OK|FAILED)?")
# common.cu's CUDACHECK/NCCLCHECK: "<host>: Test CUDA failure common.cu:941 'system not yet initialized'",
# "Test NCCL failure common.cu:1005 'unhandled cuda error'", and the older "NCCL failure all_reduce.cu:95 '...'"
# (NVIDIA/nccl-tests issues #5, #66, #264, #280, #322).
_ABORT = re.compile(r"(?:Test )?(?P<what>CUDA|NCCL) failure (?P<where>\S+:\d+) '(?P<why>[^']*)'?")
_TEST_FAILURE = re.compile(r"Test failure (\S+:\d+)")
# "#  Rank  0 Group  0 Pid   1231 on  host device  0 [0000:00:06] NVIDIA H100 80GB HBM3": rank 0 prints one
# line for every rank of the communicator under "# Using devices" (nccl-tests common.cu).
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+")
_MARKERS = re.compile(r"Avg bus bandwidth|nccl-tests|_perf\b|\bnThread \d+ nGpus \d+ minBytes|#\s+size\s+count\s+type|"
                      r"#\s+bytes\s+N\s+type|Test (?:CUDA|NCCL) failure \S+:\d+|Out of bounds values|"
                      # a data row: size, count, type, op (root since 2.13), time
                      r"\b\d+\s+\d+\s+(?:float|double|half|bfloat16|u?int(?:8|32|64)|fp8_e\dm\d)\s+"
                      r"(?:sum|prod|max|min|avg|none|mulsum)\s+(?:-?\d+\s+)?[\d.]+\s")
MAX_BYTES = 64 * 1024 * 1024


def looks_like(head: str) -> bool:
    """Whether the text is nccl-tests output (for `--format auto`)."""
    return _MARKERS.search(head) is not None


def _clean(line: str) -> str:
    for _ in range(3):
        new = _PREFIX.sub("", line.lstrip())
        if new == line:
            break
        line = new
    return line.strip()


def parse(text: str, node: str, now: float, min_busbw: float | None = None, exit_code: int | None = None) -> Result:
    if not text or not text.strip():
        return error_result(node, "nccl", "nccl-tests printed nothing", now)
    if len(text) > MAX_BYTES:
        return error_result(node, "nccl", f"{len(text)} bytes of output is over the {MAX_BYTES} limit", now)
    rows: list[tuple[int, float, float, str, float, str]] = []
    oob = avg = None
    ranks: set[int] = set()
    errors: list[str] = []
    aborts: dict[str, str] = {}  # ordered, without repeats (every rank prints the same)
    followups: dict[str, str] = {}
    for raw in text.splitlines():
        line = _clean(raw)
        if not line or set(line) <= {".", "\u2026", " "}:  # blank, or "..." where rows were left out
            continue
        m = _ABORT.search(line)
        if m is not None:
            aborts.setdefault(f"{m['what']} failure at {m['where']}: {m['why'].strip(' /')}", "")
            continue
        m = _TEST_FAILURE.search(line)
        if m is not None:  # the line that follows the cause, naming only where the test gave up
            followups.setdefault(f"the test failed at {m.group(1)}", "")
            continue
        if line.startswith("#"):
            m = _RANK.match(line)
            if m:
                ranks.add(int(m.group(1)))
            m = _OOB.match(line)
            if m:
                oob = (int(m.group(1)), m.group(2))
            m = _AVG.match(line)
            if m:
                avg = float(m.group(1))
            if line.startswith("# error:") or line.startswith("#  error:"):
                errors.append(line[1:].strip())
            continue
        fields = line.split()
        if len(fields) >= 12 and fields[0].isdigit():
            # 13 fields since the root column came in; 12 before it.
            f = fields if len(fields) >= 13 and _is_int(fields[4]) else fields[:4] + ["-1"] + fields[4:]
            try:
                rows.append((int(f[0]), float(f[6]), float(f[7]), f[8], float(f[11]), f[12]))
            except (ValueError, IndexError):
                return error_result(node, "nccl", f"unreadable data row: {line[:120]!r}", now)
    abort = [CheckResult("nccl.abort", "fail", f"nccl-tests aborted: {why}"[:300], "critical", code="ABORTED")
             for why in (aborts or followups)]
    if not rows and abort:
        return Result(node, "nccl", now, now, tuple(abort))
    if not rows:
        return error_result(node, "nccl", "no result rows: the test did not run (or this is not nccl-tests output)",
                            now)
    checks: list[CheckResult] = []
    size, algbw, busbw_oop, wrong_oop, busbw_ip, wrong_ip = max(rows, key=lambda r: r[0])
    # With two or more ranks both columns move the data across the links, and the gate reads the larger
    # (the pair image's out-of-place is a device copy and then the all-reduce, below nccl-tests' own).
    # With one rank nothing crosses a link, and in place is a no-op (one H100, sendrecv_perf 2.19.6:
    # 1,314.7 GB/s out of place, 194,233 GB/s in place): the out-of-place figure is kept, and a floor is
    # not judged (below).
    busbw = busbw_oop if len(ranks) == 1 else max(busbw_oop, busbw_ip)
    peak = max(max(r[2], r[4]) for r in rows)
    metrics = [Metric("nccl.busbw_largest", busbw, "GB/s"), Metric("nccl.algbw_largest", algbw, "GB/s"),
               Metric("nccl.busbw_oop_largest", busbw_oop, "GB/s"), Metric("nccl.busbw_ip_largest", busbw_ip, "GB/s"),
               Metric("nccl.busbw_peak", peak, "GB/s"), Metric("nccl.largest_bytes", float(size), "B")]
    if avg is not None:
        metrics.append(Metric("nccl.busbw_avg", avg, "GB/s"))
    wrong = [r for r in rows if _nonzero(r[3]) or _nonzero(r[5])]
    checks.append(CheckResult("nccl.correctness", "fail" if wrong else "pass",
                              f"{len(wrong)} message size(s) with wrong values" if wrong else "no wrong values",
                              "critical" if wrong else "info", code="WRONG" if wrong else None))
    if oob is None:
        checks.append(CheckResult("nccl.complete", "fail", "no footer: the test did not finish", "critical",
                                  code="TRUNCATED"))
    elif oob[0] > 0 or oob[1] == "FAILED":
        checks.append(CheckResult("nccl.complete", "fail", f"{oob[0]} out-of-bounds values", "critical", code="OOB"))
    else:
        checks.append(CheckResult("nccl.complete", "pass", "finished, no out-of-bounds values"))
    for e in errors:
        checks.append(CheckResult("nccl.error", "fail", e[:300], "critical"))
    checks.extend(abort)
    if min_busbw is not None and len(ranks) == 1:
        # busbw = algbw * 2(n-1)/n for all_reduce: 0 by definition with one rank; other collectives copy
        # within the GPU. Neither measured a link: no verdict on the node's bandwidth (a real H100,
        # all_reduce_perf -g 1: "Avg bus bandwidth : 0").
        checks.append(CheckResult("nccl.busbw", "error", "one rank ran: a single GPU measures no link's bandwidth "
                                  f"(the floor of {min_busbw:g} GB/s needs two or more ranks)", "warning",
                                  code="ONE_RANK"))
    elif min_busbw is not None:
        ok = busbw >= min_busbw
        checks.append(CheckResult("nccl.busbw", "pass" if ok else "fail",
                                  f"bus bandwidth {busbw:g} GB/s at {size} B; floor {min_busbw:g}",
                                  "info" if ok else "critical", code=None if ok else "LOW_BANDWIDTH"))
    if exit_code not in (None, 0) and all(c.status == "pass" for c in checks):
        return error_result(node, "nccl", f"nccl-tests exited {exit_code} but its output shows no failure", now,
                            code=f"exit {exit_code}")
    return Result(node, "nccl", now, now, tuple(checks), tuple(metrics))


def _is_int(value: str) -> bool:
    return value.lstrip("-").isdigit()


def _nonzero(value: str) -> bool:
    """#wrong is a count; before nccl-tests resynced with NCCL 2.13 the column was `error`, the
    largest float error, where a tiny value is normal rounding."""
    if value in ("N/A", "0"):
        return False
    try:
        number = float(value)
    except ValueError:
        return True
    if value.isdigit():
        return number != 0
    return abs(number) > 1e-3
