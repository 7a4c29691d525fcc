"""A pair sweep's two pod logs (images/nccl-pair's `pair-allreduce`, rank 0 and rank 1) as one
result about the pair: the path-MTU probes each way (`pair.mtu`) and the two-node all-reduce
(`pair.nccl`), with metric `nccl.pair_busbw`.

Each rank's log holds its MTU probes, each framed by marker lines around ping's own output:

    # pair-mtu iface=eth0 mtu=9001 peer=<peer>
    <ping -M do -s MTU-28 -c 3 -W 2 -I eth0 peer>
    # pair-mtu-end iface=eth0 rc=<ping's exit code>

then rank 0's all_reduce table in nccl-tests' shape, read by `sweeper.parsers.nccl`. A rank that
exits 2 timed out in torch's rendezvous: its peer never came, a fault of the run, not of a node.

Each check names the node whose own log it was read from (`host`): the table's findings are rank
0's (`node`), a probe's its rank's, an abort the rank's that said it. A node taken over prints its
own log, so its log may blame only itself (sweeper.pairing.node_verdicts reads `host`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from sweeper.parsers import nccl, ping
from sweeper.result import CheckResult, Metric, Result, error_result, tool_result

SOURCE = "pair"
_BEGIN = re.compile(r"^# pair-mtu iface=(?P<iface>\S+) mtu=(?P<mtu>\d+) peer=(?P<peer>\S*)\s*$")
_END = re.compile(r"^# pair-mtu-end iface=(?P<iface>\S+) rc=(?P<rc>-?\d+)\s*$")
# torch.distributed.elastic's words when the c10d rendezvous is not met in time
# (torch/distributed/elastic/rendezvous/api.py: RendezvousTimeoutError).
_RDZV = re.compile(r"RendezvousTimeoutError|rendezvous .*timed out|The node '.*' has failed to join", re.I)
# How NCCL (and torch around it) says a collective died: NCCL's WARN lines (net plugins NET/OFI, NET/IB),
# torch's DistBackendError / "NCCL error in:", and CUDA's own errors.
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html
_ABORT = re.compile(r"NCCL WARN .*|DistBackendError.*|NCCL error.*|ncclSystemError.*|ncclRemoteError.*|"
                    r"ncclInternalError.*|ncclUnhandledCudaError.*|CUDA error.*|NET/(?:OFI|IB|Socket).*(?:error|failed).*",
                    re.I)
RDZV_EXIT = 2


def split(log: str) -> tuple[dict[str, tuple[int | None, int | None, str]], str]:
    """The MTU probes of one rank's log (iface -> (mtu, ping's exit code, ping's output)) and the
    rest of the log (the all-reduce's output)."""
    probes: dict[str, tuple[int | None, int | None, str]] = {}
    rest: list[str] = []
    current: tuple[str, int] | None = None
    body: list[str] = []
    for line in log.splitlines():
        text = line.strip()
        if current is None and (m := _BEGIN.match(text)):
            current, body = (m["iface"], int(m["mtu"])), []
            continue
        if current is not None and (m := _END.match(text)):
            probes[current[0]] = (current[1], int(m["rc"]), "\n".join(body))
            current = None
            continue
        (body if current is not None else rest).append(line)
    if current is not None:  # the probe never ended: ping was cut short
        probes[current[0]] = (current[1], None, "\n".join(body))
    return probes, "\n".join(rest)


def _abort_line(log: str) -> str:
    for line in log.splitlines():
        m = _ABORT.search(line)
        if m:
            return m.group(0).strip()[:300]
    return ""


def parse(logs: Sequence[str], node: str, now: float, *, partner: str = "", min_busbw: float | None = None,
          mtu: int | None = None, ifaces: Sequence[str] = (), exit_codes: Sequence[int | None] = (),
          no_floor: str = "") -> Result:
    """Rank 0's and rank 1's logs (in that order; rank 0 ran on `node`, rank 1 on `partner`);
    `no_floor`: why there is no bandwidth floor, when `min_busbw` is None."""
    logs = list(logs) + [""] * (2 - len(logs))
    codes = list(exit_codes) + [None] * (2 - len(exit_codes))
    hosts = (node, partner or "the partner")
    for rank in (0, 1):
        if codes[rank] == RDZV_EXIT or _RDZV.search(logs[rank]):
            line = next((ln.strip() for ln in logs[rank].splitlines() if _RDZV.search(ln)), "")
            return tool_result(node, now, "RendezvousTimeout",
                               f"the pair's rendezvous timed out on {hosts[rank]} (rank {rank}): its peer pod never "
                               "started; a fault of the run, not of either node", line[:300])
    if not any(log.strip() for log in logs):
        return error_result(node, SOURCE, "neither pod of the pair printed anything", now)
    checks: list[CheckResult] = []
    split_logs = [split(log) for log in logs[:2]]
    checks += _mtu_checks(split_logs, hosts, mtu, ifaces)
    rest0 = split_logs[0][1]
    table = nccl.parse(rest0, node, now, min_busbw=None, exit_code=codes[0])
    metrics: list[Metric] = []
    busbw = next((m.value for m in table.metrics if m.name == "nccl.busbw_largest"), None)
    footer = not any(c.code == "TRUNCATED" for c in table.checks)
    # nccl-tests' own "Test failure common.cu:N" after a finished table only says the values were wrong.
    aborts = [CheckResult("pair.nccl", "fail", c.message, "critical", code="ABORTED", host=node)
              for c in table.checks if c.code == "ABORTED" and not (footer and "the test failed at" in c.message)]
    if not aborts:
        aborts = _rank_aborts(logs, codes, hosts)
    checks += aborts
    if busbw is None or aborts:  # no table, or one cut short: its last row is no bandwidth of the pair
        if not aborts:
            read = next((c for c in table.checks if c.status == "error"), None)
            checks.append(CheckResult("pair.nccl", "error", read.message if read else "no all-reduce table",
                                      "critical", code=read.code if read else None, host=node))
        return Result(node, SOURCE, now, now, tuple(checks))
    metrics.append(Metric("nccl.pair_busbw", busbw, "GB/s"))
    metrics += [Metric(m.name.replace("nccl.", "nccl.pair_", 1), m.value, m.unit) for m in table.metrics
                if m.name in ("nccl.busbw_peak", "nccl.largest_bytes")]
    wrong = [c for c in table.checks if c.code in ("WRONG", "OOB")]
    for c in wrong:
        checks.append(CheckResult("pair.nccl", "fail", f"{c.message} between {node} and {hosts[1]}", "critical",
                                  code="NCCL_WRONG", host=node))
    for c in table.checks:
        if c.status == "fail" and c.code not in ("WRONG", "OOB", "ABORTED"):
            checks.append(CheckResult("pair.nccl", "fail", c.message, "critical", code=c.code, host=node))
    if not wrong and not aborts:
        checks.append(CheckResult("pair.nccl", "pass", "no wrong or out-of-bounds values", host=node))
    largest = next((int(m.value) for m in table.metrics if m.name == "nccl.largest_bytes"), 0)
    if min_busbw is None:
        checks.append(CheckResult("pair.nccl", "skip", f"bus bandwidth {busbw:g} GB/s at {largest} B; "
                                  + (no_floor or "no floor for this profile (nccl_pair_busbw_min)"), host=node))
    else:
        good = busbw >= min_busbw
        checks.append(CheckResult("pair.nccl", "pass" if good else "fail",
                                  f"bus bandwidth {busbw:g} GB/s at {largest} B between {node} and {hosts[1]}; "
                                  f"floor {min_busbw:g}", "info" if good else "critical",
                                  code=None if good else "LOW_BANDWIDTH", host=node))
    return Result(node, SOURCE, now, now, tuple(checks), tuple(metrics))


def _mtu_checks(split_logs: list[tuple[dict[str, tuple[int | None, int | None, str]], str]],
                hosts: tuple[str, str], mtu: int | None, ifaces: Sequence[str]) -> list[CheckResult]:
    """One `pair.mtu` check per interface and direction: rank 0 probed from node to partner, rank 1 back."""
    wanted = list(ifaces) or sorted({i for probes, _ in split_logs for i in probes})
    checks = []
    for rank, (probes, _) in enumerate(split_logs):
        way = f"{hosts[rank]} -> {hosts[1 - rank]}"
        for iface in wanted:
            if iface not in probes:
                checks.append(CheckResult("pair.mtu", "error", f"{iface} {way}: no path-MTU probe in rank {rank}'s log",
                                          "critical", code="PING", host=hosts[rank]))
                continue
            probe_mtu, rc, text = probes[iface]
            found = ping.judge(ping.read(text), "pair.mtu", f"{iface} {way}", mtu or probe_mtu, rc)
            checks.append(dataclasses.replace(found, host=hosts[rank]))
    return checks


# Exit codes of a container killed from outside (SIGTERM, then SIGKILL after the grace period): when one
# pod of a pair fails, the Job (backoffLimit 0) fails and its controller deletes the other pod, whose
# container then ends 143 or 137 (https://kubernetes.io/docs/concepts/workloads/controllers/job/#job-termination-and-cleanup,
# https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination). That exit is the
# other rank's doing, not this rank's word that the collective died.
KILLED = (137, 143)


def _rank_aborts(logs: list[str], codes: list[int | None], hosts: tuple[str, str]) -> list[CheckResult]:
    """The ranks that say the all-reduce died: each that exited non-zero with NCCL's words in its
    own log; then, beside those, each that exited non-zero without them (its own exit is its word
    that the collective died), unless it was killed from outside (KILLED, with no words of its own).
    Each finding names the rank whose log it came from."""
    worded, silent = [], []
    for rank in (0, 1):
        if codes[rank] in (None, 0):
            continue
        why = _abort_line(logs[rank])
        if why:
            worded.append(CheckResult("pair.nccl", "fail", f"the all-reduce aborted on {hosts[rank]} (rank {rank}'s "
                                      f"log): {why}", "critical", code="ABORTED", host=hosts[rank]))
        elif codes[rank] not in KILLED:
            silent.append(CheckResult("pair.nccl", "fail", f"rank {rank} on {hosts[rank]} exited {codes[rank]} as "
                                      "the all-reduce died", "critical", code="ABORTED", host=hosts[rank]))
    return worded + silent if worded else []


def busbw(result: Result) -> float | None:
    """The pair's bus bandwidth at the largest message, if the table was read."""
    return next((m.value for m in result.metrics if m.name == "nccl.pair_busbw"), None)
