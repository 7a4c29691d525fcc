"""The simulated fabric under a pair sweep's pods, through the official client: two pods of an
Indexed Job run `pair-allreduce` as a gang; rank 0 prints its path-MTU probes and a two-node
all-reduce table whose bandwidth the slower node's fabric sets; the fabric faults show in it.

What the real tools print, which the simulator's output follows:
- iputils ping, a path that carries the probe (`ping -M do -s 8973 -c 3 -W 2 -I eth0 PEER`):
  `3 packets transmitted, 3 received, 0% packet loss, time 2003ms`; a local interface whose MTU
  is smaller than the probe: `ping: local error: message too long, mtu=1500`, once per packet,
  and `+3 errors` in the summary (https://jasonmurray.org/posts/2020/linuxmtucache/ shows the
  older "Message too long" capitalisation; iputils' ping.c has the summary's `+N errors`); a path
  that drops jumbo frames silently: `3 packets transmitted, 0 received, 100% packet loss`.
- aws-ofi-nccl, when a request fails on EFA: `NCCL WARN NET/OFI Request 0x7fbb944701b8 completed
  with error. RC: 20. Error: unknown error. Completed length: 0, ...`
  (https://github.com/aws/aws-ofi-nccl/issues/156); NCCL's own IB transport: `NCCL WARN NET/IB :
  Got completion from peer 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129
  (Recv)` (https://github.com/NVIDIA/nccl/issues/1405).
- torchrun when the other node never joins a c10d rendezvous: a traceback through
  dynamic_rendezvous.py ending `torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError`
  (the class is raised with no message; pytorch torch/distributed/elastic/rendezvous/dynamic_rendezvous.py);
  the pair program says the same by that name when the peer's DNS name never appears.
- two p5.48xlarge nodes, all_reduce_perf 8 B to 16 GB: busbw 479.28 GB/s at 8589934592 B
  (aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sweeper.parsers import nccl
from sweeper.sim.fleet import HARDWARE
from tests.conftest import Sim, fleet_spec

INDEX = "batch.kubernetes.io/job-completion-index"
PEAK = HARDWARE["p5.48xlarge"]["nccl_pair_peak"]


def pair_job(name: str, a: str, b: str, fabric: dict[str, str] | None = None, **env: str) -> dict[str, Any]:
    """A pair Job as the contract shapes it: Indexed, two completions at once, bound to A and B by
    node affinity and kept apart by anti-affinity, each pod asking for all GPUs and EFA devices."""
    variables = [{"name": "PAIR_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}},
                 {"name": "PAIR_JOB", "value": name}, {"name": "PAIR_SERVICE", "value": name},
                 {"name": "PAIR_MTU", "value": "9001"}, {"name": "PAIR_IFACES", "value": "eth0"},
                 {"name": "PAIR_GPUS", "value": "8"}]
    variables += [{"name": k, "value": v} for k, v in env.items()]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {"pair": name}}, "spec": {
                         "restartPolicy": "Never", "subdomain": name,
                         "affinity": {
                             "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                                 {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                        "values": [a, b]}]}]}},
                             "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                                 {"labelSelector": {"matchLabels": {"pair": name}},
                                  "topologyKey": "kubernetes.io/hostname"}]}},
                         "containers": [{"name": "nccl", "image": "example.com/nccl-pair:1",
                                         "command": ["pair-allreduce"], "env": variables,
                                         "resources": {"limits": {"nvidia.com/gpu": "8", **(
                                             fabric or {"vpc.amazonaws.com/efa": "32"})}}}]}}}}


def run_pair(sim: Sim, name: str, a: str = "gpu-00", b: str = "gpu-01", fabric: dict[str, str] | None = None,
             **env: str) -> dict[int, tuple[int, str, str]]:
    """Run one pair Job to its end: per index, (exit code, node, log)."""
    sim.batch.create_namespaced_job("default", pair_job(name, a, b, fabric, **env))
    sim.wait_for(lambda: any(c.status == "True" for c in
                             sim.batch.read_namespaced_job(name, "default").status.conditions or []),
                 timeout=20, what=f"pair Job {name} to finish")
    out = {}
    for p in sim.core.list_namespaced_pod("default", label_selector=f"batch.kubernetes.io/job-name={name}").items:
        code = p.status.container_statuses[0].state.terminated.exit_code
        out[int(p.metadata.annotations[INDEX])] = (code, p.spec.node_name,
                                                   pod_log(sim, p.metadata.name))
    return out


def pod_log(sim: Sim, name: str) -> str:
    return str(sim.core.read_namespaced_pod_log(name, "default", _preload_content=False).data.decode())


def busbw(log: str) -> float:
    r = nccl.parse(log, "gpu-00", 0.0)
    return next(m.value for m in r.metrics if m.name == "nccl.busbw_largest")


def test_a_healthy_pair_runs_as_a_gang_and_prints_both_ranks_logs(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(nodes=2)
    job = sim.batch.create_namespaced_job("default", pair_job("hp", "gpu-00", "gpu-01"))
    assert job.metadata.name == "hp"
    sim.wait_for(lambda: sim.batch.read_namespaced_job("hp", "default").status.succeeded == 2, timeout=20,
                 what="both indexes")
    pods = {int(p.metadata.annotations[INDEX]): p for p in
            sim.core.list_namespaced_pod("default", label_selector="batch.kubernetes.io/job-name=hp").items}
    assert {pods[0].spec.node_name, pods[1].spec.node_name} == {"gpu-00", "gpu-01"}
    # A gang: both end together, the pair's run time after the later of the two started.
    ends = {p.status.container_statuses[0].state.terminated.finished_at for p in pods.values()}
    assert len(ends) == 1
    rank0 = pod_log(sim, pods[0].metadata.name)
    rank1 = pod_log(sim, pods[1].metadata.name)
    probe = rank0.split("# pair-mtu-end")[0]
    assert probe.startswith("# pair-mtu iface=eth0 mtu=9001 peer=hp-1.hp\n")
    assert re.search(r"^PING hp-1\.hp \(10\.1\.\d+\.\d+\) from 10\.1\.\d+\.\d+ eth0: 8973\(9001\) bytes of data\.$",
                     probe, re.M)
    assert re.search(r"^8981 bytes from hp-1\.hp \([\d.]+\): icmp_seq=3 ttl=\d+ time=[\d.]+ ms$", probe, re.M)
    assert "3 packets transmitted, 3 received, 0% packet loss, time 2003ms" in probe
    assert "# pair-mtu-end iface=eth0 rc=0" in rank0
    ranks = re.findall(r"^#  Rank +(\d+) Group  0 Pid +\d+ on +(\S+) device +(\d+)", rank0, re.M)
    assert [int(r) for r, _, _ in ranks] == list(range(16))
    assert [h for _, h, _ in ranks] == ["hp-0"] * 8 + ["hp-1"] * 8, "the ranks' hosts are the pods' hostnames"
    assert "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592" in rank0
    assert "# Out of bounds values : 0 OK" in rank0
    result = nccl.parse(rank0, "gpu-00", 0.0, min_busbw=0.8 * PEAK, exit_code=0)
    assert result.status == "pass", [(c.name, c.message) for c in result.checks]
    assert 0.96 * PEAK <= busbw(rank0) <= 1.04 * PEAK
    assert "peer=hp-0.hp" in rank1 and "Rank" not in rank1
    assert rank1.endswith("# pair-allreduce rank 1 done\n")


def test_the_slower_side_sets_the_bandwidth(make_sim: Callable[..., Sim]) -> None:
    """Healthy > degraded, and a pair runs at its slower node's fabric: a link at 80% beside one
    at 50% gives about half the peak; without GPUDirect RDMA about a quarter."""
    sim = make_sim(nodes=6, faults={"gpu-02": {"link_degraded": 0.8}, "gpu-03": {"link_degraded": 0.5},
                                    "gpu-05": {"gpudirect_off": True}})
    healthy = busbw(run_pair(sim, "h", "gpu-00", "gpu-01")[0][2])
    mixed = run_pair(sim, "m", "gpu-02", "gpu-03")
    degraded = busbw(mixed[0][2])
    no_gdr = busbw(run_pair(sim, "g", "gpu-04", "gpu-05")[0][2])
    assert healthy > degraded > no_gdr
    assert 0.5 * 0.96 * PEAK <= degraded <= 0.5 * 1.04 * PEAK
    assert 0.25 * 0.96 * PEAK <= no_gdr <= 0.25 * 1.04 * PEAK
    assert mixed[0][0] == mixed[1][0] == 0, "a slow pair is a finding of the parser, not a crash"


def test_a_corrupting_fabric_counts_wrong_values(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(nodes=2, faults={"gpu-01": {"fabric_corrupt": True}})
    log = run_pair(sim, "c")[0][2]
    rows = [ln.split() for ln in log.splitlines() if ln.strip() and ln.split()[0].isdigit() and "float" in ln]
    assert any(int(r[8]) > 0 or int(r[12]) > 0 for r in rows)
    m = re.search(r"^# Out of bounds values : (\d+) (\w+)$", log, re.M)
    assert m and int(m.group(1)) > 0 and m.group(2) == "FAILED"
    assert nccl.parse(log, "gpu-00", 0.0).status == "fail"


def test_path_mtu_faults_show_in_the_probes_as_iputils_prints_them(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(nodes=4, faults={"gpu-01": {"path_mtu": {"eth0": 1500}}, "gpu-02": {"mtu": 1500}})
    lost = run_pair(sim, "lost", "gpu-00", "gpu-01")
    text = lost[0][2].split("# pair-mtu-end")[0]
    assert "3 packets transmitted, 0 received, 100% packet loss, time" in text and "bytes from" not in text
    assert "# pair-mtu-end iface=eth0 rc=1" in lost[0][2]
    assert "# pair-mtu-end iface=eth0 rc=1" in lost[1][2], "the path drops jumbo frames both ways"
    assert lost[0][0] == 0, "the all-reduce still ran: the probe's result is the parser's to judge"
    local = run_pair(sim, "local", "gpu-02", "gpu-03")
    by_node = {node: log for _, node, log in local.values()}
    assert by_node["gpu-02"].count("ping: local error: message too long, mtu=1500\n") == 3
    assert "3 packets transmitted, 0 received, +3 errors, 100% packet loss" in by_node["gpu-02"]
    assert "# pair-mtu-end iface=eth0 rc=0" in by_node["gpu-03"], "the other node's own interface is fine"


def test_a_peer_that_never_starts_ends_in_a_rendezvous_timeout(make_sim: Callable[..., Sim]) -> None:
    """The other pod cannot be placed (its node is cordoned): its DNS name never appears, so rank 0
    waits PAIR_RDZV_TIMEOUT and ends with exit 2 in RendezvousTimeoutError's name, probing nothing."""
    sim = make_sim(nodes=2)
    sim.core.patch_node("gpu-01", {"spec": {"unschedulable": True}})
    sim.batch.create_namespaced_job("default", pair_job("lone", "gpu-00", "gpu-01", PAIR_RDZV_TIMEOUT="300"))
    pod = sim.wait_for(lambda: next((p for p in sim.core.list_namespaced_pod(
        "default", label_selector="batch.kubernetes.io/job-name=lone").items if p.status.phase == "Failed"), None),
        timeout=20, what="rank 0 to give up")
    assert pod.metadata.annotations[INDEX] == "0"
    state = pod.status.container_statuses[0].state.terminated
    assert state.exit_code == 2
    started = pod.status.container_statuses[0].state.terminated.started_at
    assert (state.finished_at - started).total_seconds() >= 300
    log = pod_log(sim, pod.metadata.name)
    assert log == ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: the peer lone-1.lone never "
                   "came within 300s (pair-allreduce, rank 0)\n")


def test_a_late_peer_within_the_timeout_joins_the_gang(make_sim: Callable[..., Sim]) -> None:
    """Rank 0 runs and waits; its peer is placed only when its node is uncordoned. Both then end
    together, the pair's run time after the later one started, and the pair succeeds."""
    from sweeper.sim.tools import NCCL_PAIR_SECONDS

    sim = make_sim(nodes=2)
    sim.core.patch_node("gpu-01", {"spec": {"unschedulable": True}})
    sim.batch.create_namespaced_job("default", pair_job("late", "gpu-00", "gpu-01", PAIR_RDZV_TIMEOUT="360000"))

    def pods() -> dict[int, Any]:
        return {int(p.metadata.annotations[INDEX]): p for p in sim.core.list_namespaced_pod(
            "default", label_selector="batch.kubernetes.io/job-name=late").items}

    # The Job's pods appear at the controllers' next step, which a fast first list can come before.
    sim.wait_for(lambda: len(ps := pods()) == 2 and ps[0].status.phase == "Running"
                 and (ps[1].status.conditions or [None])[0],
                 what="rank 0 running, rank 1 unschedulable")
    assert pods()[1].spec.node_name is None
    sim.core.patch_node("gpu-01", {"spec": {"unschedulable": False}})
    sim.wait_for(lambda: sim.batch.read_namespaced_job("late", "default").status.succeeded == 2, timeout=20,
                 what="the pair to finish")
    states = {i: p.status.container_statuses[0].state.terminated for i, p in pods().items()}
    assert states[0].exit_code == states[1].exit_code == 0
    assert states[0].started_at < states[1].started_at
    assert states[0].finished_at == states[1].finished_at
    assert (states[1].finished_at - states[1].started_at).total_seconds() >= NCCL_PAIR_SECONDS


def test_a_flapping_port_varies_widely_and_aborts_some_runs(make_sim: Callable[..., Sim]) -> None:
    sim = make_sim(nodes=2, faults={"gpu-01": {"port_flapping": True}})
    runs = [run_pair(sim, f"f{i}") for i in range(8)]
    aborted = [r for r in runs if r[0][0] == 1]
    finished = [busbw(r[0][2]) for r in runs if r[0][0] == 0]
    assert aborted and len(finished) >= 2
    assert max(finished) - min(finished) > 0.1 * PEAK and max(finished) < PEAK
    a = aborted[0]
    assert a[1][0] == 1, "both ranks see the network fail"
    assert "NCCL WARN NET/OFI Request" in a[0][2] and "completed with error" in a[0][2]
    assert "torch.distributed.DistBackendError" in a[0][2]
    assert "# Avg bus bandwidth" not in a[0][2], "the table stops where the run died"
    assert nccl.parse(a[0][2], "gpu-00", 0.0, exit_code=1).status in ("fail", "error")


def test_an_infiniband_pair_aborts_in_nccl_ib_words_and_probes_only_what_it_is_given(
        make_sim: Callable[..., Sim]) -> None:
    sim = make_sim({"name": "nd", "seed": 3, "node_groups": [
        {"name_prefix": "nd-", "count": 2, "instance_type": "Standard_ND96isr_H100_v5"}],
        "faults": {"nd-01": {"port_flapping": True}}})
    ib = {"rdma/ib": "8"}
    runs = [run_pair(sim, f"ib{i}", "nd-00", "nd-01", ib, PAIR_MTU="", PAIR_IFACES="") for i in range(8)]
    assert all("# pair-mtu" not in log for r in runs for _, _, log in r.values()), "no MTU given: no probe"
    aborted = next(r for r in runs if r[0][0] == 1)
    assert "NCCL WARN NET/IB : Got completion from peer" in aborted[0][2]
    assert "status=12" in aborted[0][2] and "NET/OFI" not in aborted[0][2]


def test_a_fleet_seed_replays_the_same_pair_figures(make_sim: Callable[..., Sim]) -> None:
    """The noise, the flaps and the aborts come from the fleet's seed and the pair's count of runs,
    not from timing: the same seed gives the same figures, another seed others."""
    def figures(s: int) -> list[str]:
        sim = make_sim(fleet_spec(nodes=2, faults={"gpu-01": {"port_flapping": True}}, seed=s))
        logs = [run_pair(sim, f"d{i}")[0] for i in range(3)]
        return [f"{code} " + " ".join(" ".join(ln.split()[5:8]) for ln in log.splitlines() if " float " in ln)
                for code, _, log in logs]

    first, again, other = figures(5), figures(5), figures(6)
    assert first == again
    assert first != other
