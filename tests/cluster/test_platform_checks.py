"""Node-local checks that read what the platform keeps on the node: the kernel's journal beside the
ring buffer (journald's directories, mounted read-only), and EFA from sysfs, through the simulated
kubelet."""

from __future__ import annotations

from sweeper.history import History
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

# XID 109 (context switch timeout): the driver asks for a GPU reset, and NVIDIA's device plugin does
# not mark the GPU unhealthy for it (an application XID), so only the kernel log tells.
XID_109 = {"xids": [{"code": 109, "gpu": 3, "at": "0s", "text": "Ctx switch timeout"}], "ring_buffer_span": "10m"}


def test_an_xid_the_ring_buffer_lost_is_found_in_the_journal(make_sim, history: History) -> None:
    """A noisy driver overwrites the few MiB of the kernel ring buffer within hours, and `dmesg`
    then no longer shows an XID of this morning; journald read it from /dev/kmsg and keeps it
    (https://www.freedesktop.org/software/systemd/man/latest/systemd-journald.service.html). The
    check reads both, so the XID is judged within its window; a node whose host keeps no journal is
    judged on the ring buffer alone, as before."""
    sim: Sim = make_sim(nodes=3, faults={"gpu-00": XID_109, "gpu-01": {**XID_109, "no_journal": True},
                                         "gpu-02": {**XID_109, "journal_newer": True}})
    sim.cluster.clock.advance(3600)  # the XID is an hour old: past the ring buffer's 10 minutes
    assert "Xid" not in sim.cluster.kernel_log("gpu-00", sim.cluster.clock.now())
    report = run_sweep(sim, history, TEST_CONFIG)
    got = {o.node: o.verdict for o in report.outcomes}
    assert got["gpu-01"] == "pass" and got["gpu-02"] == "pass", report.outcomes
    assert got["gpu-00"] not in ("pass", "warn", "error", "inconclusive"), report.outcomes
    reasons = next(o.reasons for o in report.outcomes if o.node == "gpu-00")
    assert any("XID 109" in r for r in reasons), reasons
    # What the journal could not give is said on the node, never taken for a clean journal.
    unread = {r["node"]: r["message"] for r in history.db.query(
        "select node, message from checks where name = 'xid.journal' and status = 'skip'")}
    assert set(unread) == {"gpu-01", "gpu-02"}, unread
    assert "no journal files" in unread["gpu-01"] and "format newer" in unread["gpu-02"], unread


def test_a_check_template_that_mounts_no_journal_reads_none(make_sim, history: History, tmp_path) -> None:
    """The simulated kubelet gives the check the journal only through the pod's own hostPath mount
    of /var/log/journal, as a node does: an author's check template without it finds no journal
    files, says so (`xid.journal` skip), and judges the ring buffer alone."""
    import shutil
    from dataclasses import replace

    shutil.copytree(TEST_CONFIG.path("job-templates"), tmp_path, dirs_exist_ok=True)
    text = (tmp_path / "sweeper-check.yaml.j2").read_text()
    for d in ("var", "run"):
        name = "host-journal" if d == "var" else "host-run-journal"
        mount = (f"            - name: {name}\n              mountPath: /host/{d}/log/journal\n"
                 "              readOnly: true\n              recursiveReadOnly: Enabled\n"
                 "              mountPropagation: None\n")
        volume = f'        - name: {name}\n          hostPath:\n            path: /{d}/log/journal\n            type: ""\n'
        assert mount in text and volume in text
        text = text.replace(mount, "").replace(volume, "")
    (tmp_path / "sweeper-check.yaml.j2").write_text(text)
    sim: Sim = make_sim(nodes=1, faults={"gpu-00": XID_109})
    sim.cluster.clock.advance(3600)
    report = run_sweep(sim, history, replace(TEST_CONFIG, template_dir=str(tmp_path)))
    assert [o.verdict for o in report.outcomes] == ["pass"], report.outcomes
    (msg,) = [r["message"] for r in history.db.query("select message from checks where name = 'xid.journal'")]
    assert "no journal files" in msg


def test_a_p5_sweep_judges_efa_from_sysfs_and_says_fi_info_was_not_run(make_sim, history: History) -> None:
    """The EFA installer's fi_info needs the host's libfabric and rdma-core and /dev/infiniband, which
    the check Job does not mount (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html):
    `efa.fi_info` is skip with that reason, the node's 32 EFA devices are read from sysfs, and the
    sweep passes on them (fewer in sysfs than expected fails nic.devices: tests/test_checks.py)."""
    from dataclasses import replace

    from sweeper.profiles import load_profile

    sim: Sim = make_sim(nodes=1)
    assert load_profile(TEST_CONFIG.path("profiles") / "p5.48xlarge.yaml").nic == "efa"
    report = run_sweep(sim, history, replace(TEST_CONFIG, interval=0))
    assert [(o.node, o.verdict) for o in report.outcomes] == [("gpu-00", "pass")], report.outcomes
    checks = {(r["node"], r["name"]): r for r in history.db.query(
        "select node, name, status, message from checks")}
    fi = checks[("gpu-00", "efa.fi_info")]
    assert fi["status"] == "skip" and "/opt/amazon/efa" in fi["message"], fi
    assert checks[("gpu-00", "nic.devices")]["status"] == "pass" and "32" in checks[("gpu-00", "nic.devices")]["message"]


def light_on_a_busy_node(make_sim, history: History, cfg_changes: dict, **fleet: object) -> tuple[Sim, object]:
    from dataclasses import replace

    from tests.cluster.test_sweep import running_pods_on

    sim: Sim = make_sim(fleet_spec(nodes=1, workloads=[{"node": "gpu-00", "gpus": 8, "duration": None}], **fleet))
    sim.wait_for(lambda: running_pods_on(sim.cluster, "gpu-00"), what="the training pod")
    report = run_sweep(sim, history, replace(TEST_CONFIG, **cfg_changes))
    (light,) = [o for o in report.outcomes if o.node == "gpu-00"]
    assert light.action == "light"
    return sim, light


def test_a_light_check_that_its_runtime_shows_no_gpu_says_so_and_marks_no_suspect(make_sim, history: History) -> None:
    """GKE: no NVIDIA runtime (containerd's default is runc) and no RuntimeClass `nvidia`; its device
    plugin exposes GPUs only to pods that request them (https://cloud.google.com/kubernetes-engine/
    docs/how-to/gpus). The light check, which requests none, cannot read NVML there: an `error` with
    the reason, never a lost GPU, and the busy node is not made a suspect."""
    sim, light = light_on_a_busy_node(make_sim, history, {"platform": "gke"}, runtime_classes=[],
                                      default_runtime="runc")
    assert light.verdict == "error", light  # type: ignore[attr-defined]
    assert any("requests no GPU" in r for r in light.reasons), light  # type: ignore[attr-defined]
    assert "sweeper.dev/suspect" not in (sim.core.read_node("gpu-00").metadata.labels or {})


def test_a_light_check_sees_the_gpus_through_nvidias_runtime(make_sim, history: History, tmp_path) -> None:
    """EKS and AKS GPU images make NVIDIA's runtime containerd's default: with platform eks (no
    RuntimeClass named) the light check reads every GPU, as it does through RuntimeClass `nvidia`
    on a GPU Operator cluster (platform generic)."""
    _, light = light_on_a_busy_node(make_sim, history, {"platform": "eks"}, runtime_classes=[])
    assert light.verdict == "pass", light  # type: ignore[attr-defined]
    other = History(tmp_path / "other.db")
    try:
        _, light = light_on_a_busy_node(make_sim, other, {}, default_runtime="runc")
    finally:
        other.close()
    assert light.verdict == "pass", light  # type: ignore[attr-defined]


def test_dcgm_through_the_nodes_own_host_engine_starts_no_second_one(make_sim, history: History) -> None:
    """On a GPU Operator node dcgm-exporter already runs a host engine. A DCGM sweep that starts its
    own says so in the sweep's log; with `dcgm_hostengine: node`, dcgmi talks to the node's engine
    on its own address (status.hostIP, port 5555) instead, and nothing is said. The default,
    `dcgm_hostengine: auto`, finds the operator's nvidia-dcgm on every GPU node and does the same."""
    from dataclasses import replace

    spec = fleet_spec(nodes=1)
    spec["node_groups"][0]["operands"] = True
    sim: Sim = make_sim(spec)

    def second_engine(report: object) -> list[str]:
        return [d["msg"] for e, d in report.events if e == "log"  # type: ignore[attr-defined]
                and "second DCGM host engine" in d.get("msg", "")]

    cfg = replace(TEST_CONFIG, playbook="sweep-dcgm.yaml", interval=0)
    report = run_sweep(sim, history, replace(cfg, dcgm_hostengine=""))
    assert [(o.node, o.verdict) for o in report.outcomes] == [("gpu-00", "pass")]
    assert second_engine(report), "an engine of its own beside dcgm-exporter's: said"
    report = run_sweep(sim, history, replace(cfg, dcgm_hostengine="node"))
    assert [(o.node, o.verdict) for o in report.outcomes] == [("gpu-00", "pass")]
    assert second_engine(report) == []
    report = run_sweep(sim, history, cfg)
    assert [(o.node, o.verdict) for o in report.outcomes] == [("gpu-00", "pass")]
    assert second_engine(report) == []
    assert any("nvidia-dcgm runs on every GPU node" in n for n in report.plan.notes), report.plan.notes
    checks = [c["name"] for c in history.db.query("select name from checks")]
    assert any(name.startswith("dcgm.") for name in checks), "the diagnostic ran and was read"


# -- what a node has is read from the node ------------------------------------------------------

def test_a_karpenter_node_launched_without_efa_is_not_short_of_efa(make_sim, history: History) -> None:
    """Karpenter (and EKS Auto Mode) gives an instance EFA interfaces only when a pod that requests
    `vpc.amazonaws.com/efa` made it launch; otherwise it has none
    (https://docs.aws.amazon.com/eks/latest/userguide/device-management-efa.html). The number of EFA
    devices expected is what the node advertises before the instance type's 32: a p5 that
    advertises none is swept without an EFA count, one that advertises 32 is held to 32."""
    from dataclasses import replace

    spec = fleet_spec(nodes=2, faults={"gpu-01": {"nics_missing": 32}})
    spec["node_groups"][0]["labels"] = {"karpenter.sh/nodepool": "gpu"}
    sim: Sim = make_sim(spec)
    assert sim.core.read_node("gpu-01").status.capacity["vpc.amazonaws.com/efa"] == "0"
    report = run_sweep(sim, history, replace(TEST_CONFIG, interval=0))
    assert {o.node: o.verdict for o in report.outcomes} == {"gpu-00": "pass", "gpu-01": "pass"}, report.outcomes
    rows = history.db.query("select node, name, status from checks where name in ('nic.devices', 'efa.fi_info')")
    got = {(r["node"], r["name"]): r["status"] for r in rows}
    assert got[("gpu-01", "nic.devices")] == "skip" and ("gpu-01", "efa.fi_info") not in got
    assert got[("gpu-00", "nic.devices")] == "pass" and got[("gpu-00", "efa.fi_info")] == "skip"  # not run: see above


def test_a_gke_a3_without_multi_networking_is_not_short_of_gvnics(make_sim, history: History) -> None:
    """An A3's GPU gVNICs are the interfaces of its node pool's additional networks: with no
    multi-networking it has its primary gVNIC only
    (https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx; without
    multi-networking a node has its one primary interface:
    https://cloud.google.com/kubernetes-engine/docs/how-to/setup-multinetwork-support-for-pods). GKE lists
    a node's additional networks in its networking.gke.io/north-interfaces annotation; the count the
    check expects is theirs, not the instance type's 4."""
    from dataclasses import replace

    spec = fleet_spec(nodes=0)
    spec["node_groups"] = [{"name_prefix": "a3-", "count": 1, "instance_type": "a3-highgpu-8g"},
                           {"name_prefix": "solo-", "count": 1, "instance_type": "a3-highgpu-8g",
                            "multi_network": False}]
    sim: Sim = make_sim(spec)
    assert "networking.gke.io/north-interfaces" not in (sim.core.read_node("solo-00").metadata.annotations or {})
    report = run_sweep(sim, history, replace(TEST_CONFIG, interval=0))
    assert {o.node: o.verdict for o in report.outcomes} == {"a3-00": "pass", "solo-00": "pass"}, report.outcomes
    rows = history.db.query("select node, status from checks where name = 'nic.devices'")
    assert {r["node"]: r["status"] for r in rows} == {"a3-00": "pass", "solo-00": "pass"}
