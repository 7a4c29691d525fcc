"""The pair sweep's two pod logs read as one result: the path-MTU probes each way (`pair.mtu`) and
the two-node all-reduce (`pair.nccl`, metric `nccl.pair_busbw`).

The ping lines are iputils' own (ping/ping_common.c; the failures as published in
https://bugzilla.kernel.org/show_bug.cgi?id=213669, kept under fixtures/real/); the table is
nccl-tests' shape (https://github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md); the rendezvous
timeout is torch.distributed.elastic's RendezvousTimeoutError
(https://pytorch.org/docs/stable/elastic/rendezvous.html)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.parsers import pair, ping
from sweeper.result import CheckResult, Result

REAL = Path(__file__).parent / "fixtures" / "real"
A, B = "gpu-a", "gpu-b"

PING_OK = """PING sweep-pair-gpu-a-0abc12-1.sweep-pair-gpu-a-0abc12 (10.0.3.7) 8973(9001) bytes of data.
8981 bytes from 10.0.3.7: icmp_seq=1 ttl=64 time=0.211 ms
8981 bytes from 10.0.3.7: icmp_seq=2 ttl=64 time=0.180 ms
8981 bytes from 10.0.3.7: icmp_seq=3 ttl=64 time=0.176 ms

--- sweep-pair-gpu-a-0abc12-1.sweep-pair-gpu-a-0abc12 ping statistics ---
3 packets transmitted, 3 received, 0% packet loss, time 2003ms
rtt min/avg/max/mdev = 0.176/0.189/0.211/0.015 ms"""
PING_DROPPED = """PING peer (10.0.3.7) 8973(9001) bytes of data.

--- peer ping statistics ---
3 packets transmitted, 0 received, 100% packet loss, time 2035ms"""
PING_LOCAL = """PING peer (10.0.3.7) 8973(9001) bytes of data.
ping: local error: message too long, mtu=1500
ping: local error: message too long, mtu=1500
ping: local error: message too long, mtu=1500

--- peer ping statistics ---
3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 2041ms"""
PING_LOSSY = """PING peer (10.0.3.7) 8973(9001) bytes of data.
8981 bytes from 10.0.3.7: icmp_seq=1 ttl=64 time=0.211 ms
8981 bytes from 10.0.3.7: icmp_seq=3 ttl=64 time=0.176 ms

--- peer ping statistics ---
3 packets transmitted, 2 received, 33.3333% packet loss, time 2003ms"""


def table(busbw: float = 411.2, wrong: int = 0, oob: str = "0 OK") -> str:
    """Rank 0's all-reduce table as allreduce_bench.py prints it, in nccl-tests' shape."""
    ranks = "\n".join(f"#  Rank {r:2d} Group  0 Pid {100 + r:6d} on {A if r < 8 else B:>10} device {r % 8:2d} "
                      f"[0000:{r:02x}:00] NVIDIA H100 80GB HBM3" for r in range(16))
    return f"""# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
{ranks}
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    61.20    0.00    0.00       0    60.91    0.00    0.00       0
   1073741824     268435456     float     sum      -1   4907.1  218.81  410.27       0   4911.0  218.64  409.94       0
  8589934592    2147483648     float     sum      -1  39169.3  219.30  {busbw:.2f}  {wrong:6d}  39208.0  219.08  {busbw - 0.5:.2f}       0
# Out of bounds values : {oob}
# Avg bus bandwidth    : 137.2
#"""


def probe(iface: str, text: str, rc: int, peer: str = "peer", mtu: int = 9001) -> str:
    return f"# pair-mtu iface={iface} mtu={mtu} peer={peer}\n{text}\n# pair-mtu-end iface={iface} rc={rc}"


def logs(rank0_ping: str = PING_OK, rank1_ping: str = PING_OK, body: str | None = None,
         rc0: int = 0, rc1: int = 0) -> list[str]:
    return [probe("eth0", rank0_ping, rc0) + "\n" + (table() if body is None else body),
            probe("eth0", rank1_ping, rc1) + "\n# pair-allreduce rank 1 done"]


def read(log_pair: list[str], **kw: object) -> Result:
    args: dict[str, object] = {"partner": B, "min_busbw": 350.0, "mtu": 9001, "ifaces": ["eth0"]} | kw
    return pair.parse(log_pair, A, 0.0, **args)  # type: ignore[arg-type]


def by_name(result: Result, name: str) -> list[CheckResult]:
    return [c for c in result.checks if c.name == name]


def test_a_healthy_pair_passes_with_its_bandwidth_and_both_directions() -> None:
    result = read(logs())
    assert result.status == "pass", result.to_dict()
    mtu = by_name(result, "pair.mtu")
    assert [c.message.split(":")[0] for c in mtu] == [f"eth0 {A} -> {B}", f"eth0 {B} -> {A}"]
    assert pair.busbw(result) == 411.2
    assert {m.name for m in result.metrics} >= {"nccl.pair_busbw"}
    assert result.node == A and result.source == "pair"


def test_a_pair_under_the_floor_fails_low_bandwidth_and_no_floor_is_a_skip() -> None:
    low = read(logs(body=table(busbw=201.5)))
    assert low.status == "fail"
    assert [c.code for c in low.failed_checks] == ["LOW_BANDWIDTH"]
    assert "201.5 GB/s" in low.failed_checks[0].message and "floor 350" in low.failed_checks[0].message
    free = read(logs(body=table(busbw=201.5)), min_busbw=None)
    assert free.status == "pass"
    (skipped,) = [c for c in free.checks if c.status == "skip"]
    assert skipped.name == "pair.nccl" and "nccl_pair_busbw_min" in skipped.message


@pytest.mark.parametrize("body,words", [
    (table(wrong=12, oob="12 FAILED"), "wrong values"),
    (table(oob="3 FAILED"), "out-of-bounds"),
])
def test_wrong_or_out_of_bounds_values_fail_nccl_wrong(body: str, words: str) -> None:
    result = read(logs(body=body))
    assert result.status == "fail"
    codes = {c.code for c in result.failed_checks}
    assert codes == {"NCCL_WRONG"}, result.to_dict()
    assert any(words in c.message for c in result.failed_checks)


def test_the_published_two_node_wrong_values_fail_nccl_wrong_through_the_pair_reader() -> None:
    """NVIDIA/nccl-tests#369: two GH200 nodes over libfabric, 96 wrong values at 1 MiB."""
    text = (REAL / "nccl-two-node-gh200-libfabric-wrong-at-1mib.txt").read_text()
    result = pair.parse([text, "# pair-allreduce rank 1 done"], A, 0.0, partner=B, min_busbw=None, exit_codes=(1, 1))
    assert result.status == "fail"
    assert "NCCL_WRONG" in {c.code for c in result.failed_checks}


@pytest.mark.parametrize("rank,text,code", [
    (0, PING_DROPPED, "PATH_MTU"),
    (1, PING_DROPPED, "PATH_MTU"),
    (0, PING_LOCAL, "PATH_MTU"),
    (1, PING_LOSSY, "PACKET_LOSS"),
])
def test_a_path_mtu_fault_names_its_interface_and_direction(rank: int, text: str, code: str) -> None:
    pings = [PING_OK, PING_OK]
    pings[rank] = text
    result = read(logs(pings[0], pings[1], rc0=1 if rank == 0 else 0, rc1=1 if rank == 1 else 0))
    bad = [c for c in by_name(result, "pair.mtu") if c.status != "pass"]
    assert len(bad) == 1 and bad[0].code == code
    way = f"{A} -> {B}" if rank == 0 else f"{B} -> {A}"
    assert bad[0].message.startswith(f"eth0 {way}: ")
    assert result.status == ("warn" if code == "PACKET_LOSS" else "fail")
    assert pair.busbw(result) == 411.2, "the all-reduce is still read"


def test_a_missing_probe_is_an_error_never_a_pass() -> None:
    result = read([table(), "# pair-allreduce rank 1 done"], ifaces=["eth0", "eth1"])
    mtu = by_name(result, "pair.mtu")
    assert len(mtu) == 4 and all(c.status == "error" for c in mtu)
    assert result.status == "error"


def test_a_rendezvous_timeout_is_a_fault_of_the_run() -> None:
    """Exit 2 of pair-allreduce: torch's c10d rendezvous was not met, the peer pod never came."""
    words = ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: The node 'x' has failed to "
             "join the rendezvous in time")
    result = pair.parse([probe("eth0", PING_DROPPED, 1) + "\n" + words, ""], A, 0.0, partner=B, min_busbw=350.0,
                        ifaces=["eth0"], exit_codes=(2, None))
    assert result.status == "error"
    assert [c.code for c in result.checks] == ["RendezvousTimeout"]
    assert "peer pod never started" in result.checks[0].message and A in result.checks[0].message


def test_an_abort_in_ncclS_own_words_fails_aborted() -> None:
    """A rank that exits 1 with NCCL's WARN line (a net plugin's completion error) aborted the
    collective: a fault on the path, `fail` with code ABORTED."""
    half = table().split("   1073741824")[0]
    rank1 = (probe("eth0", PING_OK, 0) + "\nip-10-0-3-7:77:91 [3] NCCL WARN NET/OFI Request 0x7f completed with error. "
             "RC: 5. Error: 5 (Input/output error)\ntorch.distributed.DistBackendError: NCCL error in: "
             "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error")
    result = read([probe("eth0", PING_OK, 0) + "\n" + half, rank1], exit_codes=(1, 1))
    assert result.status == "fail"
    assert {c.code for c in result.failed_checks} == {"ABORTED"}
    assert "NET/OFI" in result.failed_checks[0].message and B in result.failed_checks[0].message


def hosts_of(result: Result) -> dict[tuple[str, str | None], set[str | None]]:
    """Each finding that is not a pass, by check and code: the nodes whose own logs gave it."""
    out: dict[tuple[str, str | None], set[str | None]] = {}
    for c in result.checks:
        if c.status in ("fail", "warn", "error"):
            out.setdefault((c.name, c.code), set()).add(c.host)
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_probe_finding_names_the_rank_whose_own_probe_it_was(rank: int) -> None:
    pings = [PING_OK, PING_OK]
    pings[rank] = PING_DROPPED
    result = read(logs(pings[0], pings[1]))
    assert hosts_of(result) == {("pair.mtu", "PATH_MTU"): {(A, B)[rank]}}
    assert [c.host for c in by_name(result, "pair.mtu")] == [A, B], "every probe names its rank's node"


@pytest.mark.parametrize("body,code", [
    (table(busbw=201.5), "LOW_BANDWIDTH"),
    (table(wrong=12, oob="12 FAILED"), "NCCL_WRONG"),
])
def test_the_tables_findings_are_rank_0s(body: str, code: str) -> None:
    """Rank 0 prints the table (in a re-pair, rank 0 is the suspect): a slow or corrupting link
    is read from the suspect's own log."""
    assert hosts_of(read(logs(body=body))) == {("pair.nccl", code): {A}}


def test_an_abort_only_the_partner_prints_is_the_partners_alone() -> None:
    """Rank 1 exits 1 with NCCL's words; rank 0 finished its table and exited 0: the abort is rank
    1's word only, and names it."""
    rank1 = probe("eth0", PING_OK, 0) + "\n" + "gpu-b:1:2 [0] NCCL WARN NET/IB : Got completion from peer with error"
    result = read([logs()[0], rank1], exit_codes=(0, 1))
    assert hosts_of(result) == {("pair.nccl", "ABORTED"): {B}}
    assert "rank 1's log" in result.failed_checks[0].message


@pytest.mark.parametrize("nic", ["ib", "efa"])
def test_an_abort_of_the_suspects_own_nic_shows_in_its_own_log(nic: str) -> None:
    """The simulator's flapping port (NCCL's NET/IB or aws-ofi-nccl's NET/OFI words, then torch's):
    both ranks exit 1 and print it; rank 0's table stops where the link dropped. The findings
    name rank 0, whose log it is, whatever rank 1 says."""
    from sweeper.sim import tools

    half = table().split("   1073741824")[0]
    rank0 = probe("eth0", PING_OK, 0) + "\n" + half + "\n" + tools.net_error(nic, A, 3, "10.1.0.3")
    rank1 = probe("eth0", PING_OK, 0) + "\n" + tools.net_error(nic, B, 3, "10.1.0.2")
    found = hosts_of(read([rank0, rank1], exit_codes=(1, 1)))
    assert set(found) == {("pair.nccl", "ABORTED")} and A in found[("pair.nccl", "ABORTED")]


def test_a_rank_that_exits_without_words_beside_an_abort_is_named_too() -> None:
    """Rank 0 exited 1 with no NCCL words, rank 1 printed them: both ranks said the all-reduce died."""
    half = table().split("   1073741824")[0]
    rank1 = probe("eth0", PING_OK, 0) + "\nNCCL WARN NET/OFI Request completed with error"
    result = read([probe("eth0", PING_OK, 0) + "\n" + half, rank1], exit_codes=(1, 1))
    assert hosts_of(result) == {("pair.nccl", "ABORTED"): {A, B}}
    assert "NET/OFI" in result.failed_checks[0].message, "the words first"


@pytest.mark.parametrize("killed", [143, 137])
def test_a_rank_killed_when_its_partner_failed_is_not_named(killed: int) -> None:
    """Rank 1 prints an abort and exits 1; the Job (backoffLimit 0) fails and its controller deletes
    rank 0's pod, whose container ends 143 (SIGTERM) or 137 (SIGKILL after the grace period). That
    exit is the other rank's doing: only rank 1's own word names anyone. Counted as rank 0's, a node
    taken over, known-good and re-paired with a healthy suspect, could have had it blamed."""
    half = table().split("   1073741824")[0]
    rank1 = probe("eth0", PING_OK, 0) + "\nNCCL WARN NET/OFI Request completed with error"
    result = read([probe("eth0", PING_OK, 0) + "\n" + half, rank1], exit_codes=(killed, 1))
    assert hosts_of(result) == {("pair.nccl", "ABORTED"): {B}}


def test_a_missing_probe_names_the_rank_that_left_it_out() -> None:
    result = read([logs()[0], "# pair-allreduce rank 1 done"])
    assert hosts_of(result) == {("pair.mtu", "PING"): {B}}


def test_nothing_to_read_is_an_error() -> None:
    assert pair.parse(["", ""], A, 0.0, partner=B).status == "error"
    result = read([probe("eth0", PING_OK, 0), probe("eth0", PING_OK, 0)])
    assert result.status == "error" and by_name(result, "pair.nccl")[0].status == "error"


def test_the_split_keeps_pings_out_of_the_table() -> None:
    probes, rest = pair.split(logs()[0])
    assert list(probes) == ["eth0"] and probes["eth0"][:2] == (9001, 0)
    assert "packets transmitted" not in rest and "Avg bus bandwidth" in rest


@pytest.mark.parametrize("text,status,code", [
    (PING_OK, "pass", None),
    (PING_DROPPED, "fail", "PATH_MTU"),
    (PING_LOCAL, "fail", "PATH_MTU"),
    (PING_LOSSY, "warn", "PACKET_LOSS"),
    ("From 10.0.0.1 icmp_seq=1 Frag needed and DF set (mtu = 1500)\n\n--- x ping statistics ---\n"
     "1 packets transmitted, 0 received, +1 errors, 100% packet loss", "fail", "PATH_MTU"),
    ("ping: peer: Name or service not known", "error", "PING"),
    ("PING peer (10.0.3.7) 8973(9001) bytes of data.", "error", "PING"),
])
def test_the_ping_reader(text: str, status: str, code: str | None) -> None:
    check = ping.judge(ping.read(text), mtu=9001)
    assert (check.status, check.code) == (status, code), check
