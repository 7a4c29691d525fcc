"""iputils `ping` output, as a path-MTU probe reads it (`ping -M do -s SIZE`: the don't-fragment
bit set, so a packet too large for the path is dropped or refused rather than fragmented).

Three ways a probe that is too large fails, each in ping's own words:
- the local interface's MTU is smaller than the probe: the kernel refuses the send and ping prints
  `ping: local error: message too long, mtu=1500` (older builds: `Message too long`), counted as
  `+N errors` in the statistics;
- a router on the path answers ICMP "fragmentation needed": `From 10.0.0.1 icmp_seq=1 Frag needed
  and DF set (mtu = 1500)`;
- the path drops jumbo frames silently: nothing comes back, `3 packets transmitted, 0 received,
  100% packet loss`.
The statistics line's shape is iputils' (ping/ping_common.c, `finish()`):
https://github.com/iputils/iputils/blob/master/ping/ping_common.c
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sweeper.result import CheckResult, Metric, Result, error_result

_HEADER = re.compile(r"^PING (?P<host>\S+) \((?P<addr>[^)]*)\) (?P<size>\d+)\((?P<wire>\d+)\) bytes of data")
_STATS = re.compile(r"(?<!\d)(?P<tx>\d+) packets transmitted, (?P<rx>\d+) (?:packets )?received"
                    r"(?:, \+(?P<dup>\d+) duplicates)?(?:, \+(?P<corrupt>\d+) corrupted)?"
                    r"(?:, \+(?P<errors>\d+) errors)?, (?P<loss>[\d.]+)% packet loss")
_LOCAL = re.compile(r"local error: [Mm]essage too long, mtu=(?P<mtu>\d+)")
_FRAG = re.compile(r"From (?P<hop>\S+)(?: \([^)]*\))? icmp_seq=\d+ Frag needed and DF set \(mtu = (?P<mtu>\d+)\)")
_FAILURE = re.compile(r"^ping: (?P<why>.*(?:Name or service not known|Temporary failure in name resolution|"
                      r"unknown host|Network is unreachable|SO_BINDTODEVICE|Operation not permitted|"
                      r"No such device|Cannot assign requested address|invalid argument).*)$", re.I)
_MARKERS = re.compile(r"^PING \S+ \([^)]*\) \d+\(\d+\) bytes of data|packets transmitted, \d+ (?:packets )?received",
                      re.M)


@dataclass(frozen=True)
class Probe:
    """What one ping run says: the payload size, what went and came back, and why not."""

    host: str = ""
    size: int | None = None  # ICMP payload bytes (-s)
    wire: int | None = None  # the IP packet's size: payload + 28 (IPv4)
    transmitted: int | None = None  # None: no statistics line (ping did not finish)
    received: int = 0
    errors: int = 0
    local_mtu: int | None = None  # the MTU the local interface refused the probe at
    path_mtu: int | None = None  # the MTU a router on the path said it carries
    hop: str = ""  # that router
    failure: str = ""  # ping could not probe at all (no such host, no such interface)


def looks_like(head: str) -> bool:
    """Whether the text is ping output (for `--format auto`)."""
    return _MARKERS.search(head) is not None


def read(text: str) -> Probe:
    """One ping run's output, read line by line; a line ping did not print is ignored."""
    host, size, wire, failure, hop = "", None, None, "", ""
    tx: int | None = None
    rx = errors = 0
    local_mtu = path_mtu = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _HEADER.match(line):
            host, size, wire = m["host"], int(m["size"]), int(m["wire"])
        elif m := _STATS.search(line):
            tx, rx, errors = int(m["tx"]), int(m["rx"]), int(m["errors"] or 0)
        elif m := _LOCAL.search(line):
            local_mtu = int(m["mtu"])
        elif m := _FRAG.search(line):
            path_mtu, hop = int(m["mtu"]), m["hop"]
        elif m := _FAILURE.match(line):
            failure = failure or m["why"].strip()
    return Probe(host, size, wire, tx, rx, errors, local_mtu, path_mtu, hop, failure)


def judge(probe: Probe, name: str = "ping.mtu", where: str = "", mtu: int | None = None,
          exit_code: int | None = None) -> CheckResult:
    """The probe as a check: `pass` when every probe came back, `fail` (PATH_MTU) when the size did
    not get through, `warn` (PACKET_LOSS) when some did, `error` when ping could not probe at all."""
    what = f"{where}: " if where else ""
    size = f"{probe.wire}-byte" if probe.wire else "the"
    target = f" (MTU {mtu})" if mtu else ""
    if probe.failure:
        return CheckResult(name, "error", f"{what}ping could not probe: {probe.failure}"[:300], "critical",
                           code="PING")
    if probe.local_mtu is not None:
        return CheckResult(name, "fail", f"{what}{size} packets{target} refused: the interface's MTU is "
                           f"{probe.local_mtu}", "critical", code="PATH_MTU")
    if probe.path_mtu is not None:
        return CheckResult(name, "fail", f"{what}{size} packets{target} do not fit: {probe.hop} says the path "
                           f"carries {probe.path_mtu}", "critical", code="PATH_MTU")
    if probe.transmitted is None:
        return CheckResult(name, "error", f"{what}ping printed no statistics (exit {exit_code}): it did not finish",
                           "critical", code="PING")
    if probe.transmitted == 0:
        return CheckResult(name, "error", f"{what}ping sent nothing", "critical", code="PING")
    if probe.received == 0:
        return CheckResult(name, "fail", f"{what}none of {probe.transmitted} {size} probes{target} came back: the "
                           "path drops packets of this size", "critical", code="PATH_MTU")
    if probe.received < probe.transmitted:
        return CheckResult(name, "warn", f"{what}{probe.received} of {probe.transmitted} {size} probes{target} "
                           "came back", "warning", code="PACKET_LOSS")
    return CheckResult(name, "pass", f"{what}{probe.received} of {probe.transmitted} {size} probes{target} came back "
                       "unfragmented")


def parse(text: str, node: str, now: float, mtu: int | None = None, exit_code: int | None = None) -> Result:
    """`sweeper ingest --format ping`: one ping run's output as a result."""
    if not text or not text.strip():
        return error_result(node, "ping", "ping printed nothing", now)
    probe = read(text)
    if probe.transmitted is None and not (probe.failure or probe.local_mtu or probe.path_mtu or probe.size):
        return error_result(node, "ping", "no ping header or statistics: this is not ping output", now)
    check = judge(probe, mtu=mtu, exit_code=exit_code)
    metrics = (Metric("ping.received", float(probe.received)),) if probe.transmitted is not None else ()
    return Result(node, "ping", now, now, (check,), metrics)
