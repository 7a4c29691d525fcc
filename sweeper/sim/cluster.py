"""The simulated control plane and nodes: scheduler, job controller, kubelet, workload
generator and fault model, all stepping on one shared clock.

Why it is long: `SimCluster` is one object on purpose. Its controllers (scheduler, job
controller, MPI operator, device plugin and GPU Operator operands, kubelet and the programs its
pods run, workload generator) step in turn under one lock over one store and one fault model, as
a cluster's do; they read and write each other's state on every step. What reads a pod's spec
alone lives in `podspec`, the node's hardware in `fleet`, the tools' output in `tools`, and the
apiserver in `server`."""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import random
import re
import threading
import uuid
from functools import partial
from typing import Any

from sweeper.checks import evidence, run_node_checks
from sweeper.checks.fake import (
    JOURNALCTL_FORMAT,
    FakeGpu,
    FakeHost,
    FakeNvml,
    bus_id,
    efa_sysfs,
    gpu_pci,
    ib_sysfs,
    journal_file,
    netdev,
    peermem,
    sxid_line,
    topo_output,
    xid_line,
)
from sweeper.checks.options import CheckOptions
from sweeper.clock import ScaledClock, iso, parse_iso
from sweeper.drivers import branch_of, cuda_of_branch
from sweeper.sim import claims as outside_claims
from sweeper.sim import dra, tools
from sweeper.sim import evidence as sim_evidence
from sweeper.sim.fleet import CUDA_OF_BRANCH, HARDWARE, Faults, Fleet, NodeSpec
from sweeper.sim.podspec import (
    GPU,
    INDEX_KEY,
    anti_affinity_rules,
    anti_affinity_terms,
    completion_index,
    extended_requests,
    gpu_request,
    index_ranges,
    node_affinity_matches,
    pod_security_violations,
    tolerates,
    valid_image,
)
from sweeper.sim.rollout import fails_on, topology_labels
from sweeper.sim.store import Store

RUN_SECONDS = "sim.sweeper.dev/run-seconds"
# The MPI Operator's labels on the pods it makes (pkg/apis/kubeflow/v2beta1/constants.go).
MPI_OPERATOR, MPI_JOB_NAME, MPI_ROLE, MPI_INDEX = (f"training.kubeflow.org/{k}" for k in (
    "operator-name", "job-name", "job-role", "replica-index"))
TERMINAL = ("Succeeded", "Failed")
TRAINING_NS = "training"
# The application XIDs NVIDIA's device plugin does not treat as a sick GPU; any other XID marks the
# GPU unhealthy (github.com/NVIDIA/k8s-device-plugin, internal/rm/health.go; DP_DISABLE_HEALTHCHECKS
# adds to the list).
DEVICE_PLUGIN_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

POD_SECURITY = "pod-security.kubernetes.io/enforce"
# Where Sweeper's check Jobs and its reboot / GPU reset Jobs run by default (the config's
# check_namespace and remediation_namespace; deploy/base.yaml makes both).
JOB_NAMESPACES = ("sweeper-checks", "sweeper-remediation")
OPERATOR_NS = "gpu-operator"
# The GPU Operator's operands that hold the GPUs open, by their deploy label's suffix and their pods'
# `app` label. The operator schedules each on the nodes whose nvidia.com/gpu.deploy.<operand> label is
# not "false", so a node leaves or regains an operand by that label alone.
# https://docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/getting-started.html
OPERANDS = {"device-plugin": "nvidia-device-plugin-daemonset", "gpu-feature-discovery": "gpu-feature-discovery",
            "dcgm": "nvidia-dcgm", "dcgm-exporter": "nvidia-dcgm-exporter"}
# The standalone chart's device plugin (github.com/NVIDIA/k8s-device-plugin, deployments/helm): a
# DaemonSet whose pods carry app.kubernetes.io/name=nvidia-device-plugin.
PLUGIN_NS, PLUGIN_APP = "kube-system", "nvidia-device-plugin"
# How containerd words a failed prestart hook (NVIDIA/gpu-operator#898): the hook's stderr follows.
HOOK_FAILED = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
               "failed: unable to start container process: error during container init: error running prestart "
               "hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n")
SHELLS = ("sh", "bash", "ash", "dash")
# A two-node all-reduce that NCCL runs over TCP sockets for want of its fabric: about 4 GB/s where an
# H100 pair on its fabric shows about 340 (NVIDIA AI Cluster Runtime, GKE TCPXO networking prerequisites:
# https://docs.nvidia.com/aicr/latest/integrator-guide/gke-tcpxo-networking.md).
TCP_PAIR_BUSBW = 4.0


def gfd_version_labels(driver: str) -> dict[str, str]:
    """GPU feature discovery's driver and CUDA version labels of a node running `driver`, the new names and
    the deprecated ones (NVIDIA/k8s-device-plugin: internal/lm/nvml.go, newVersionLabeler)."""
    major, minor, *rest = driver.split(".")
    branch = branch_of(driver) or 0
    cuda = CUDA_OF_BRANCH.get(branch) or f"{cuda_of_branch(branch) or 0}.0"
    cuda_major, cuda_minor = cuda.split(".")
    rev = rest[0] if rest else ""
    return {"nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": minor,
            "nvidia.com/cuda.driver.rev": rev, "nvidia.com/cuda.runtime.major": cuda_major,
            "nvidia.com/cuda.runtime.minor": cuda_minor, "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/cuda.driver-version.revision": rev,
            "nvidia.com/cuda.driver-version.full": driver, "nvidia.com/cuda.runtime-version.major": cuda_major,
            "nvidia.com/cuda.runtime-version.minor": cuda_minor, "nvidia.com/cuda.runtime-version.full": cuda}


def _update_status(obj: dict[str, Any], **values: Any) -> None:
    obj.setdefault("status", {}).update(values)


def is_ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions") or [])


class SimCluster:
    def __init__(self, fleet: Fleet, clock: ScaledClock | None = None) -> None:
        self.fleet = fleet
        self.clock = clock or ScaledClock(fleet.speed)
        self.store = Store(self.clock)
        self.rng = random.Random(fleet.seed)
        # Arrivals and their placement draw from streams of their own, in simulated time, so that the
        # same fleet gives the same story however fast the machine running it is.
        self._arrival_rng = random.Random(f"{fleet.seed}/arrivals")
        self._place_rng = random.Random(f"{fleet.seed}/placement")
        self.specs: dict[str, NodeSpec] = {n.name: n for n in fleet.nodes}
        self.started = self.clock.now()
        self.logs: dict[tuple[str, str], str] = {}
        self._finish: dict[tuple[str, str], float | None] = {}
        self.boots: dict[str, float] = {}  # node -> when it last rebooted (else its creation)
        self.rebooting: dict[str, float] = {}  # node -> when it is Ready again
        self.terminating: dict[str, float] = {}  # node -> when Karpenter has drained and removed it
        self.joining: list[tuple[float, NodeSpec]] = []  # replacement nodes and when they register
        # launched nodes still booting -> (when they are Ready, the GPU resources their device plugin then reports)
        self.warming: dict[str, tuple[float, dict[str, str]]] = {}
        self.replacements = 0
        # The simulated registry: images that do not exist, and programs an image lacks.
        self.missing_images: set[str] = set(fleet.missing_images)
        self.image_lacks: dict[str, set[str]] = {k: set(v) for k, v in fleet.image_lacks.items()}
        self._pulls: dict[tuple[str, str], tuple[int, float, float]] = {}  # pod -> (attempts, last, next)
        self._create_retry: dict[str, tuple[float, float]] = {}  # Job uid -> (next pod creation, back-off)
        self._pod_serial = 0
        self._last_step = self.started
        self._next_arrival = self._draw_arrival(self.started)
        self._stop = threading.Event()
        self._short: set[str] = set()  # nodes whose device plugin holds GPUs back from allocatable
        self._watched: set[str] = set()  # nodes with a lost GPU or XIDs among their faults
        self._with_operands: set[str] = set()  # nodes where the GPU Operator runs its operand pods
        self._with_plugin: set[str] = set()  # nodes where the standalone device plugin's pod runs
        self._dra_plugin: dict[str, str] = {}  # DRA node -> its ResourceSlice; its kubelet plugin pod runs there
        self._dra_started: set[str] = set()  # DRA nodes whose kubelet plugin started once (a new one restarts it)
        self._plugin_started: dict[str, float] = {}  # node -> when its device plugin last restarted
        self._plugin_paused: set[str] = set()  # operand nodes whose device plugin pod is gone: GPUs allocatable 0
        self._thread: threading.Thread | None = None
        # Pair runs: each gang's outcome per index (when it ends, exit code, log), and how many runs
        # each pair of nodes has had (the seed of the next one's noise).
        self._pair_outcomes: dict[str, dict[int, tuple[float, int, str]]] = {}
        self._pair_runs: dict[tuple[str, str], int] = {}
        self.store.on_delete.append(self._forget)
        self._bootstrap()

    # -- set-up ------------------------------------------------------------
    def _bootstrap(self) -> None:
        for ns in dict.fromkeys(("default", "kube-system", "kube-node-lease", TRAINING_NS, self.fleet.namespace,
                                 *JOB_NAMESPACES)):
            self.store.create("namespaces", None, {"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]},
                                                   "status": {"phase": "Active"}})
        for rc in self.fleet.runtime_classes:  # as the GPU Operator registers NVIDIA's runtime
            self.store.create("runtimeclasses", None, {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                                       "metadata": {"name": rc}, "handler": rc})
        if any(spec.operands for spec in self.fleet.nodes):
            self.store.create("namespaces", None, {"metadata": {"name": OPERATOR_NS},
                                                   "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
        if self.fleet.dra:
            self.store.create("deviceclasses", None, dra.device_class())
            self.store.create("namespaces", None, {"metadata": {"name": outside_claims.DRA_PLUGIN_NS},
                                                   "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
        for spec in self.fleet.nodes:
            self.add_node(spec)
        for queued in self.fleet.kueue_workloads:
            self._queue(queued)
        for w in self.fleet.workloads:
            self.start_training(w.gpus, w.duration, node=w.node)

    def _queue(self, queued: dict[str, Any]) -> None:
        """A fleet's `kueue_workloads` entry: a Job Kueue keeps suspended and its pending Workload."""
        ns = queued["namespace"]
        if self.store.peek("namespaces", None, ns) is None:
            self.store.create("namespaces", None, {"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]},
                                                   "status": {"phase": "Active"}})
        claim = self._count_template(ns, queued["gpus"]) if queued["claim"] else ""
        job, workload = dra.pending_workload(queued["name"], ns, queued["gpus"], queued["count"], claim,
                                             now=self.clock.now())
        uid = self.store.create("jobs", ns, job)["metadata"]["uid"]
        workload["metadata"]["labels"][f"{dra.KUEUE}/job-uid"] = uid
        workload["metadata"]["ownerReferences"][0]["uid"] = uid
        self.store.create("workloads", ns, workload)

    def _count_template(self, ns: str, gpus: int) -> str:
        """The ResourceClaimTemplate `gpus-N` for N GPUs of the DRA driver (made once per namespace)."""
        name = f"gpus-{gpus}"
        if self.store.peek("resourceclaimtemplates", ns, name) is None:
            self.store.create("resourceclaimtemplates", ns, dra.claim_template(name, ns, count=gpus))
        return name

    def provider_id(self, spec: NodeSpec, iid: str) -> str:
        """The node's spec.providerID as its platform's cloud provider writes it."""
        if self.fleet.platform == "gke":
            return f"gce://sweeper-project/{spec.zone}/{spec.name}"
        if self.fleet.platform == "aks":
            return ("azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/mc_sweeper_aks_eastus/"
                    f"providers/Microsoft.Compute/virtualMachineScaleSets/aks-gpu-vmss/virtualMachines/{iid[-4:]}")
        return f"aws:///{spec.zone}/{iid}"

    def add_node(self, spec: NodeSpec, at: float | None = None) -> dict[str, Any]:
        """The node registers (at `at`, its scheduled time, when a step comes after it)."""
        hw = HARDWARE[spec.instance_type]
        gpus = max(0, hw["gpus"] - spec.faults.missing_gpus)
        iid = "i-0" + hashlib.sha1(spec.name.encode()).hexdigest()[:16]
        labels = {
            "kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": spec.instance_type,
            "topology.kubernetes.io/zone": spec.zone, "topology.kubernetes.io/region": spec.zone[:-1],
            **(topology_labels(self.fleet.platform, spec.name) if hw["gpus"] else {}),
        }
        if hw["gpus"] and spec.gpu_operator:  # GPU feature discovery's labels, only with the GPU Operator
            labels.update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(hw["gpus"]),
                           "nvidia.com/gpu.product": hw["model"].replace(" ", "-"), **gfd_version_labels(spec.driver)})
        if spec.operands:
            labels.update({f"nvidia.com/gpu.deploy.{op}": "true" for op in OPERANDS})
        labels.update(spec.labels)
        resources = {"cpu": hw["cpu"], "memory": hw["memory"], "pods": "110", "ephemeral-storage": "3500Gi"}
        if hw["gpus"] and not spec.dra:  # a DRA node's GPUs are in its ResourceSlice instead
            resources[GPU] = str(gpus)
        for res, count in hw["fabric_resources"].items():  # the fabric's device plugin: one per device found
            resources[res] = str(max(0, count - spec.faults.nics_missing))
        annotations: dict[str, str] = {}
        if hw["nic"] == "gve" and spec.multi_network:
            # GKE lists a node's additional networks (multi-networking) in this annotation; an A3's GPU
            # gVNICs are those networks' interfaces (https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx)
            annotations["networking.gke.io/north-interfaces"] = json.dumps(
                [{"network": f"vpc{k}", "ipAddress": f"192.168.{k}.{len(self.specs) % 250 + 2}"}
                 for k in range(1, hw["nics"])])
        now = self.clock.now() if at is None else at
        launched = spec.age == 0  # just launched: its startup taints are on, and it may still be booting
        booting = launched and spec.boot > 0
        if booting:  # the kubelet registers before the device plugin reports the GPUs
            self.warming[spec.name] = (now + spec.boot, {r: resources.pop(r) for r in list(resources) if r == GPU})
        node = {
            "metadata": {"name": spec.name, "labels": labels, "annotations": annotations,
                         "creationTimestamp": iso(now - spec.age)},
            "spec": {"providerID": self.provider_id(spec, iid),
                     **({"taints": [dict(t) for t in spec.startup_taints]} if launched and spec.startup_taints else {})},
            "status": {
                "capacity": dict(resources), "allocatable": self._allocatable(spec, resources, now),
                "conditions": [{"type": "Ready", "status": "False" if spec.faults.not_ready or booting else "True",
                                "reason": "KubeletNotReady" if spec.faults.not_ready else "KubeletReady",
                                "message": "kubelet is posting ready status",
                                "lastHeartbeatTime": iso(now), "lastTransitionTime": iso(now - spec.age)}],
                "addresses": [{"type": "InternalIP", "address": f"10.0.{len(self.specs) % 250}.{hash(spec.name) % 250}"},
                              {"type": "Hostname", "address": spec.name}],
                "nodeInfo": {"kubeletVersion": "v1.31.4", "kubeProxyVersion": "v1.31.4",
                             "containerRuntimeVersion": "containerd://1.7.27", "osImage": "Amazon Linux 2023",
                             "kernelVersion": "6.1.134", "operatingSystem": "linux", "architecture": "amd64",
                             "machineID": iid, "systemUUID": iid, "bootID": str(uuid.uuid4())},
            },
        }
        self.specs[spec.name] = spec
        if spec.faults.gpu_lost or spec.faults.xids or spec.faults.xid_storm:
            self._watched.add(spec.name)
        outside_claims.on_node(node, spec.faults.outside_claims, now)
        created = self.store.create("nodes", None, node)
        if spec.dra and gpus:
            rslice = dra.resource_slice(spec.name, gpus, hw["model"])
            outside_claims.on_slice(rslice, spec.faults.outside_claims, now)
            self.store.create("resourceslices", None, rslice)
            self._dra_plugin[spec.name] = rslice["metadata"]["name"]
        if spec.operands:
            self._with_operands.add(spec.name)
            self._operands(now)
        elif spec.device_plugin_pod and hw["gpus"]:
            self._with_plugin.add(spec.name)
            self._plugin_pods(now)
        pool = labels.get("karpenter.sh/nodepool")
        if pool:
            self.store.create("nodeclaims", None, {
                "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                "metadata": {"name": f"{pool}-{hashlib.sha1(spec.name.encode()).hexdigest()[:5]}",
                             "labels": {"karpenter.sh/nodepool": pool,
                                        "node.kubernetes.io/instance-type": spec.instance_type}},
                "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                         **({"startupTaints": [dict(t) for t in spec.startup_taints]} if spec.startup_taints else {}),
                         "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": [spec.instance_type]}]},
                "status": {"nodeName": spec.name, "providerID": self.provider_id(spec, iid),
                           "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": iso(now)}]}})
        return created

    def start_training(self, gpus: int, duration: float | None, node: str | None = None,
                       running: bool = False) -> dict[str, Any]:
        ann = {} if duration is None else {RUN_SECONDS: str(int(duration))}
        pod: dict[str, Any] = {
            "metadata": {"generateName": "train-", "namespace": TRAINING_NS,
                         "labels": {"app": "training", "sim.sweeper.dev/workload": "true"}, "annotations": ann},
            "spec": {"restartPolicy": "Never", "schedulerName": "default-scheduler",
                     "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                                     "command": ["torchrun", "train.py"],
                                     "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}]},
            "status": {"phase": "Pending"},
        }
        claimed = bool(node and node in self.specs and self.specs[node].dra)
        if claimed:  # GPUs through a claim made from a template for `gpus` devices
            template = self._count_template(TRAINING_NS, gpus)
            pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
            pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpus"}]}
        if node:
            pod["spec"]["nodeName"] = node
        created = self.store.create("pods", TRAINING_NS, pod)
        if claimed and node:
            with self.store.lock:
                stored = self.store.peek("pods", TRAINING_NS, created["metadata"]["name"])
                assert stored is not None
                statuses = dra.make_claims(self.store, stored)
                self.store.mutate("pods", TRAINING_NS, created["metadata"]["name"],
                                  partial(_update_status, resourceClaimStatuses=statuses))
                dra.allocate(self.store, stored, node, self.clock.now(), dra.used_devices(self.store))
        if running:
            with self.store.lock:
                obj = self.store.peek("pods", TRAINING_NS, created["metadata"]["name"])
                assert obj is not None
                self._start_pod(obj, self.clock.now())
        return created

    # -- running -------------------------------------------------------------
    def start(self, interval: float = 0.01) -> None:
        if self._thread:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval,), name="sim-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.step()

    def step(self) -> None:
        with self.store.lock:
            now = self.clock.now()
            self._machines(now)
            self._device_plugin(now)
            self._operands(now)
            self._plugin_pods(now)
            self._dra_plugin_pods(now)
            self._arrivals(now)
            self._schedule(now)
            self._kubelet(now)
            self._jobs(now)
            self._mpijobs(now)
            self._last_step = now

    def _machines(self, now: float) -> None:
        """Nodes that finish rebooting, are terminated by Karpenter, or join as replacements."""
        for name, ready_at in list(self.rebooting.items()):
            if now >= ready_at:
                del self.rebooting[name]
                self.store.mutate("nodes", None, name, lambda n: self._set_ready(n, True, now))
        for name, gone_at in list(self.terminating.items()):
            if now >= gone_at:
                del self.terminating[name]
                if self.store.peek("nodes", None, name) is not None:
                    self.store.delete("nodes", None, name)
        # Replacements join at their scheduled time, then finish booting, in one step when the clock
        # jumped past both (the demo's hours between cycles).
        for when, spec in list(self.joining):
            if now >= when:
                self.joining.remove((when, spec))
                self.add_node(spec, at=when)
        for name, (ready_at, gpus) in list(self.warming.items()):
            if now >= ready_at:
                del self.warming[name]

                def up(n: dict[str, Any], gpus: dict[str, str] = gpus) -> None:
                    self._set_ready(n, True, now)
                    n["status"]["capacity"].update(gpus)
                    n["status"]["allocatable"].update(self._allocatable(self.specs[n["metadata"]["name"]], gpus, now))
                if self.store.peek("nodes", None, name) is not None:
                    self.store.mutate("nodes", None, name, up)

    def unhealthy_gpus(self, node_name: str, now: float) -> set[int]:
        """The GPUs NVIDIA's device plugin has marked unhealthy since the node booted: a GPU NVML
        lost, or one that raised an XID the plugin treats as critical, which is any XID but the
        application errors it skips (see DEVICE_PLUGIN_SKIPPED_XIDS)."""
        spec = self.specs.get(node_name)
        return self._unhealthy(spec, now) if spec else set()

    def _unhealthy(self, spec: NodeSpec, now: float) -> set[int]:
        # The plugin keeps a GPU's unhealthy mark until it restarts (internal/plugin/server.go: "there
        # is no way to recover from the Unhealthy state"); a new plugin sees only XIDs after its start.
        f, boot = spec.faults, max(self._boot(spec.name), self._plugin_started.get(spec.name, 0.0))
        out = set(f.gpu_lost)
        out |= {x["gpu"] for x in f.xids if x["code"] not in DEVICE_PLUGIN_SKIPPED_XIDS
                and boot <= self.started + x["at"] <= now}
        storm = f.xid_storm
        if storm and storm["code"] not in DEVICE_PLUGIN_SKIPPED_XIDS and boot <= self.started + storm["at"] <= now:
            out.add(storm["gpu"])
        return {g for g in out if 0 <= g < HARDWARE[spec.instance_type]["gpus"] - f.missing_gpus}

    def _allocatable(self, spec: NodeSpec, capacity: dict[str, str], now: float) -> dict[str, str]:
        alloc = dict(capacity)
        if GPU in alloc:
            alloc[GPU] = "0" if spec.name in self._plugin_paused else \
                str(max(0, int(capacity[GPU]) - len(self._unhealthy(spec, now))))
        return alloc

    def _device_plugin(self, now: float) -> None:
        """The device plugin's ListAndWatch as the kubelet reports it: allocatable drops by the
        unhealthy GPUs, capacity stays; after a reboot clears the fault, it is whole again. Only
        nodes whose fleet faults can make a GPU unhealthy are watched (a large fleet steps fast)."""
        for name in self._watched | self._short:
            spec = self.specs[name]
            node = self.store.peek("nodes", None, name)
            if node is None or GPU not in node["status"].get("capacity", {}):
                continue
            want = self._allocatable(spec, node["status"]["capacity"], now)[GPU]
            if node["status"]["allocatable"].get(GPU) != want:
                def report(n: dict[str, Any], want: str = want) -> None:
                    n["status"]["allocatable"][GPU] = want
                self.store.mutate("nodes", None, name, report)
            if want == node["status"]["capacity"][GPU]:
                self._short.discard(name)
            else:
                self._short.add(name)

    def _operands(self, now: float) -> None:
        """The GPU Operator's DaemonSets on the nodes that run them: an operand's pod leaves a node
        whose nvidia.com/gpu.deploy.<operand> label is "false" and comes back when it is not."""
        for name in list(self._with_operands):
            node = self.store.peek("nodes", None, name)
            if node is None:
                self._with_operands.discard(name)
                continue
            labels = node["metadata"].get("labels") or {}
            self._pause_plugin(name, labels.get("nvidia.com/gpu.deploy.device-plugin") == "false", now)
            for op, app in OPERANDS.items():
                pod_name = f"{app}-{hashlib.sha1(name.encode()).hexdigest()[:5]}"
                pod = self.store.peek("pods", OPERATOR_NS, pod_name)
                wanted = labels.get(f"nvidia.com/gpu.deploy.{op}") != "false"
                if pod is not None and not wanted:
                    self.store.delete("pods", OPERATOR_NS, pod_name)
                elif pod is None and wanted:
                    self.store.create("pods", OPERATOR_NS, {
                        "metadata": {"name": pod_name, "labels": {"app": app},
                                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": app,
                                                          "uid": app, "controller": True}]},
                        "spec": {"nodeName": name, "containers": [{"name": app, "image": f"nvcr.io/nvidia/{app}"}],
                                 "tolerations": [{"operator": "Exists"}]},
                        "status": {"phase": "Pending"}})
                    self.store.mutate("pods", OPERATOR_NS, pod_name, partial(self._start_pod, now=now))

    def _plugin_pods(self, now: float) -> None:
        """The standalone device plugin's DaemonSet: a pod on each node that runs it, started again
        when it is deleted."""
        for name in list(self._with_plugin):
            if self.store.peek("nodes", None, name) is None:
                self._with_plugin.discard(name)
                continue
            pod_name = f"{PLUGIN_APP}-{hashlib.sha1(name.encode()).hexdigest()[:5]}"
            if self.store.peek("pods", PLUGIN_NS, pod_name) is None:
                self.store.create("pods", PLUGIN_NS, {
                    "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/name": PLUGIN_APP},
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": PLUGIN_APP,
                                                      "uid": PLUGIN_APP, "controller": True}]},
                    "spec": {"nodeName": name, "containers": [{"name": PLUGIN_APP,
                                                               "image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}],
                             "tolerations": [{"operator": "Exists"}]},
                    "status": {"phase": "Pending"}})
                self.store.mutate("pods", PLUGIN_NS, pod_name, partial(self._start_pod, now=now))

    def _dra_plugin_pods(self, now: float) -> None:
        """NVIDIA's DRA driver's kubelet plugin DaemonSet: a pod on each DRA node, started again when
        it is deleted; a restarted plugin publishes the node's ResourceSlice again
        (sweeper.sim.claims.republish)."""
        for name, slice_name in list(self._dra_plugin.items()):
            if self.store.peek("nodes", None, name) is None:
                del self._dra_plugin[name]
                continue
            pod = outside_claims.dra_plugin_pod(name)
            if self.store.peek("pods", outside_claims.DRA_PLUGIN_NS, pod["metadata"]["name"]) is not None:
                continue
            self.store.create("pods", outside_claims.DRA_PLUGIN_NS, pod)
            self.store.mutate("pods", outside_claims.DRA_PLUGIN_NS, pod["metadata"]["name"],
                              partial(self._start_pod, now=now))
            if name in self._dra_started and self.store.peek("resourceslices", None, slice_name) is not None:
                self.store.mutate("resourceslices", None, slice_name, partial(
                    outside_claims.republish, lost=list(self.specs[name].faults.gpu_lost), now=now))
            self._dra_started.add(name)

    @staticmethod
    def is_plugin_pod(pod: dict[str, Any]) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return labels.get("app") == OPERANDS["device-plugin"] or labels.get("app.kubernetes.io/name") == PLUGIN_APP

    def _pause_plugin(self, name: str, paused: bool, now: float) -> None:
        """The device plugin paused (its pod gone) or back. When a plugin's endpoint stops, the kubelet
        marks every device of its resource unhealthy: allocatable drops to 0 and capacity stays
        (kubernetes/kubernetes, pkg/kubelet/cm/devicemanager/manager.go, markResourceUnhealthy), so a
        pod that requests a GPU then fits nowhere on the node; when the plugin registers again its
        devices are allocatable again."""
        if paused == (name in self._plugin_paused):
            return
        (self._plugin_paused.add if paused else self._plugin_paused.discard)(name)
        spec, node = self.specs.get(name), self.store.peek("nodes", None, name)
        if spec is None or node is None or GPU not in node["status"].get("capacity", {}):
            return
        want = self._allocatable(spec, node["status"]["capacity"], now)[GPU]

        def report(n: dict[str, Any]) -> None:
            n["status"]["allocatable"][GPU] = want
        self.store.mutate("nodes", None, name, report)

    def plugin_paused(self, node_name: str) -> bool:
        return node_name in self._plugin_paused

    def operand_pods(self, node_name: str) -> list[str]:
        """The GPU Operator's operand pods running on the node (they hold its GPUs open)."""
        apps = set(OPERANDS.values())
        return sorted(p["metadata"]["name"] for p in self.store.iter("pods")
                      if p["metadata"].get("namespace") == OPERATOR_NS and p["spec"].get("nodeName") == node_name
                      and (p["metadata"].get("labels") or {}).get("app") in apps
                      and p["status"].get("phase") == "Running")

    @staticmethod
    def _set_ready(node: dict[str, Any], ready: bool, now: float) -> None:
        for c in node["status"]["conditions"]:
            if c["type"] == "Ready":
                c.update({"status": "True" if ready else "Unknown", "lastTransitionTime": iso(now),
                          "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                          "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting "
                                                                                     "node status."})

    def _reboot_node(self, name: str, now: float) -> None:
        """The reboot Job ran: the node drops NotReady, comes back with a new boot id."""
        self.reboot(name, now)
        self.rebooting[name] = now + 300.0

        def down(n: dict[str, Any]) -> None:
            self._set_ready(n, False, now)
            n["status"]["nodeInfo"]["bootID"] = str(uuid.uuid4())
        self.store.mutate("nodes", None, name, down)

    # -- hooks from the API server --------------------------------------------
    def before_node_write(self, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
        """The race fault: a GPU pod is bound just as Sweeper's taint lands."""
        spec = self.specs.get(name)
        if not spec or spec.faults.pod_lands_on_taint <= 0:
            return
        old_keys = {t.get("key") for t in old.get("spec", {}).get("taints") or []}
        added = [t for t in new.get("spec", {}).get("taints") or [] if t.get("key") not in old_keys]
        if any(str(t.get("key", "")).endswith("/sweep") for t in added):
            spec.faults.pod_lands_on_taint -= 1
            free = self._free_gpus(old)
            if free > 0:
                self.start_training(free, None, node=name, running=True)

    def _forget(self, plural: str, obj: dict[str, Any]) -> None:
        if plural == "pods" and self.fleet.dra:
            dra.forget_pod(self.store, obj)
        if plural == "nodeclaims":
            # Karpenter: the claim's node is drained and terminated, and a replacement joins later.
            node = (obj.get("status") or {}).get("nodeName")
            now = self.clock.now()
            if node and node in self.specs:
                self.terminating[node] = now + 120.0
                old = self.specs[node]
                self.replacements += 1
                base = old.name.rstrip("0123456789").rstrip("-r") or "node-"
                fresh = NodeSpec(name=f"{base}-r{self.replacements:02d}", instance_type=old.instance_type,
                                 zone=old.zone, labels=dict(old.labels), age=0.0, faults=Faults(),
                                 device_plugin_pod=old.device_plugin_pod, dra=old.dra,
                                 startup_taints=[dict(t) for t in old.startup_taints], boot=old.boot)
                self.joining.append((now + 600.0, fresh))
        if plural == "pods":
            node = (obj.get("spec") or {}).get("nodeName")
            if node in self.specs and self.is_plugin_pod(obj):  # the plugin stops; its next pod starts afresh
                self._plugin_started[node] = self.clock.now()
                self._short.add(node)  # the kubelet reports its devices again
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            self._finish.pop(key, None)
            self._pulls.pop(key, None)
        if plural == "mpijobs":
            self._collect(obj["metadata"].get("uid", ""))
        if plural == "jobs":
            self._create_retry.pop(obj["metadata"].get("uid", ""), None)
            self._pair_outcomes.pop(obj["metadata"].get("uid", ""), None)

    # -- controllers -------------------------------------------------------------
    def _draw_arrival(self, after: float) -> float:
        rate = self.fleet.arrivals_per_hour
        return after + self._arrival_rng.expovariate(rate / 3600.0) if rate > 0 else math.inf

    def _arrivals(self, now: float) -> None:
        """A Poisson process in simulated time: each job arrives at a time drawn when the last one did."""
        while self._next_arrival <= now:
            lo, hi = self.fleet.arrival_duration
            self.start_training(self.fleet.arrival_gpus, self._arrival_rng.uniform(lo, hi))
            self._next_arrival = self._draw_arrival(self._next_arrival)

    def _used_by_node(self) -> dict[str, int]:
        """GPUs requested by unfinished pods bound to each node, in one pass over the pods."""
        return {node: used.get(GPU, 0) for node, used in self._used_extended().items()}

    def _used_extended(self) -> dict[str, dict[str, int]]:
        """Extended resources (GPUs, fabric devices) requested by unfinished pods bound to each node."""
        used: dict[str, dict[str, int]] = {}
        for p in self.store.iter("pods"):
            node = p["spec"].get("nodeName")
            if node and p["status"].get("phase") not in TERMINAL:
                mine = used.setdefault(node, {})
                for res, n in extended_requests(p).items():
                    mine[res] = mine.get(res, 0) + n
        return used

    def _free_gpus(self, node: dict[str, Any]) -> int:
        alloc = int(node["status"]["allocatable"].get(GPU, 0))
        return alloc - self._used_by_node().get(node["metadata"]["name"], 0)

    def _feasible(self, pod: dict[str, Any], node: dict[str, Any], free: dict[str, int],
                  wants: dict[str, int] | None = None, rules: list[tuple[str, str, str]] | None = None,
                  labels_of: dict[str, dict[str, str]] | None = None) -> str:
        """'' if the pod fits the node, else the scheduler's reason. `free`: the node's unrequested
        extended resources; `rules`: the pod's anti-affinity rules (anti_affinity_rules), with
        `labels_of` each node's labels."""
        if not is_ready(node):
            return "node(s) were not ready"
        tol = pod["spec"].get("tolerations")
        if node["spec"].get("unschedulable") and not tolerates(
                tol, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return "node(s) were unschedulable"
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tol, taint):
                return "node(s) had untolerated taint(s)"
        if not node_affinity_matches(pod, node):
            return "node(s) didn't match Pod's node affinity/selector"
        spec = self.specs.get(node["metadata"]["name"])
        if spec and spec.faults.checks_never_schedule and self._is_check_pod(pod):
            return "node(s) had volume node affinity conflict"
        for res, n in (extended_requests(pod) if wants is None else wants).items():
            if n > free.get(res, 0):
                return f"Insufficient {res}"
        labels = node["metadata"].get("labels") or {}
        for reason, key, where in rules or ():
            if key in labels and (labels_of or {}).get(where, {}).get(key) == labels[key]:
                return reason
        return ""

    def _schedule(self, now: float) -> None:
        pending = [p for p in self.store.iter("pods")
                   if not p["spec"].get("nodeName") and p["status"].get("phase", "Pending") == "Pending"]
        if not pending:
            return
        nodes = list(self.store.iter("nodes"))
        used = self._used_extended()
        free = {n["metadata"]["name"]: {r: int(v) - used.get(n["metadata"]["name"], {}).get(r, 0)
                                        for r, v in n["status"]["allocatable"].items() if "/" in r}
                for n in nodes}
        # Inter-pod anti-affinity is looked at only when some pod asks for it (a large fleet steps fast).
        placed: list[tuple[dict[str, Any], str]] | None = None
        labels_of: dict[str, dict[str, str]] = {}
        if any(anti_affinity_terms(p) for p in self.store.iter("pods")):
            placed = [(p, p["spec"]["nodeName"]) for p in self.store.iter("pods")
                      if p["spec"].get("nodeName") and p["status"].get("phase") not in TERMINAL]
            labels_of = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
        devices: set[tuple[str, str, str]] = set()
        if any(p["spec"].get("resourceClaims") for p in pending):
            for p in pending:
                statuses = dra.make_claims(self.store, p)
                if statuses:
                    self.store.mutate("pods", p["metadata"]["namespace"], p["metadata"]["name"],
                                      partial(_update_status, resourceClaimStatuses=statuses))
            devices = dra.used_devices(self.store)
        for pod in sorted(pending, key=lambda p: p["metadata"]["creationTimestamp"]):
            reasons: dict[str, int] = {}
            fits = []
            wants = extended_requests(pod)
            rules = anti_affinity_rules(pod, placed) if placed is not None else None
            for n in nodes:
                why = self._feasible(pod, n, free[n["metadata"]["name"]], wants, rules, labels_of) or \
                    dra.feasible(self.store, pod, n["metadata"]["name"], devices)
                if why:
                    reasons[why] = reasons.get(why, 0) + 1
                else:
                    fits.append(n)
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            if not fits:
                msg = f"0/{len(nodes)} nodes are available: " + ", ".join(
                    f"{c} {r}" for r, c in sorted(reasons.items())) + "."
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg,
                        "lastTransitionTime": iso(now)}
                if (pod["status"].get("conditions") or [{}])[0].get("message") != msg:
                    self.store.mutate("pods", ns, name, partial(_update_status, conditions=[cond]))
                continue
            choice = self._place_rng.choice(fits) if pod["metadata"].get("labels", {}).get("app") == "training" else fits[0]
            target = choice["metadata"]["name"]
            for res, count in wants.items():
                free[target][res] = free[target].get(res, 0) - count
            if placed is not None:
                placed.append((pod, target))

            dra.allocate(self.store, pod, target, now, devices)

            def bind(o: dict[str, Any], target: str = target) -> None:
                o["spec"]["nodeName"] = target
                o["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                              "lastTransitionTime": iso(now)}]
            self.store.mutate("pods", ns, name, bind)

    def _kubelet(self, now: float) -> None:
        for pod in self.store.iter("pods"):
            node_name = pod["spec"].get("nodeName")
            phase = pod["status"].get("phase", "Pending")
            if not node_name or phase in TERMINAL:
                continue
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            node = self.store.peek("nodes", None, node_name)
            if node is None:
                self.store.mutate("pods", *key, lambda o: self._terminate(o, now, 137, "NodeLost",
                                                                          "the node was deleted", ""))
                continue
            if phase == "Pending":
                short = None if pod["status"].get("startTime") else self._device_shortage(pod, node)
                if short is not None:
                    def reject(o: dict[str, Any], res: str = short[0], want: int = short[1],
                               avail: int = short[2]) -> None:
                        o["status"].update({"phase": "Failed", "reason": "UnexpectedAdmissionError",
                                            "message": f"Allocate failed due to requested number of devices "
                                                       f"unavailable for {res}. Requested: {want}, "
                                                       f"Available: {avail}"})
                    self.store.mutate("pods", *key, reject)
                    continue
                fault = self._container_fault(pod, key, now)
                if fault is not None:
                    if self._waiting(pod) != fault:
                        self.store.mutate("pods", *key, partial(self._wait, now=now, reason=fault[0],
                                                                message=fault[1]))
                    continue
                self.store.mutate("pods", *key, lambda o: self._start_pod(o, now))
                continue
            spec = self.specs.get(node_name)
            if spec and spec.faults.lose_check_pod > 0 and self._is_check_pod(pod):
                spec.faults.lose_check_pod -= 1
                self.store.delete("pods", *key)  # the kubelet lost it: the pod is simply gone
                continue
            if self._is_pair(pod):
                self._pair_step(pod, key, node_name, now)
                continue
            finish = self._finish.get(key)
            if finish is not None and now >= finish:
                exit_code, log, message = self._run(pod, node_name, now)
                self.logs[key] = log
                reason = "Completed" if exit_code == 0 else "Error"
                self.store.mutate("pods", *key, partial(self._terminate, now=now, exit_code=exit_code, reason=reason,
                                                        message=message, log=log))

    def _device_shortage(self, pod: dict[str, Any], node: dict[str, Any]) -> tuple[str, int, int] | None:
        """The kubelet's device manager at admission: (resource, requested, available) for the first
        extended resource the node's running pods leave too little of, else None."""
        wants = extended_requests(pod)
        if not wants:
            return None
        node_name = node["metadata"]["name"]
        others: dict[str, int] = {}
        for p in self.store.iter("pods"):
            if p is not pod and p["spec"].get("nodeName") == node_name and p["status"].get("phase") == "Running":
                for res, n in extended_requests(p).items():
                    others[res] = others.get(res, 0) + n
        for res, n in wants.items():
            avail = int(node["status"]["allocatable"].get(res, 0)) - others.get(res, 0)
            if n > avail:
                return res, n, avail
        return None

    def _start_pod(self, pod: dict[str, Any], now: float) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        containers = pod["spec"].get("containers") or [{}]
        pod["status"].update({
            "phase": "Running", "startTime": pod["status"].get("startTime") or iso(now), "hostIP": "10.0.0.1",
            "podIP": f"10.1.{self.rng.randint(0, 250)}.{self.rng.randint(1, 250)}",
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": iso(now)}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": c.get("name", "main"), "image": c.get("image", ""),
                                   "imageID": "", "ready": True, "started": True, "restartCount": 0,
                                   "containerID": "containerd://" + uuid.uuid4().hex,
                                   "state": {"running": {"startedAt": iso(now)}}} for c in containers],
        })
        self._finish[key] = self._planned_finish(pod, now)
        self.logs.setdefault(key, "")
        argv = self._argv(pod)
        words = self._runtime_error(pod)
        if words:
            # NVIDIA's hook (or CDI injection) fails at the OCI runtime's create: StartError, 128.
            self._terminate(pod, now, 128, "StartError",
                            words if words.startswith("failed to create") else HOOK_FAILED + words, "")
        elif argv and self._lacks(pod, argv[0]):
            # containerd cannot exec the entrypoint: the container ends at once with StartError, 128.
            self._terminate(pod, now, 128, "StartError",
                            "failed to create containerd task: failed to create shim task: OCI runtime create "
                            "failed: runc create failed: unable to start container process: exec: "
                            f'"{argv[0]}": executable file not found in $PATH: unknown', "")

    def _runtime_error(self, pod: dict[str, Any]) -> str:
        """The node's runtime_error fault, for a pod whose container asks for GPUs (a GPU resource or
        NVIDIA_VISIBLE_DEVICES): NVIDIA's hook acts only on such a container."""
        spec = self.specs.get(pod["spec"].get("nodeName", ""))
        if not spec or not spec.faults.runtime_error:
            return ""
        visible = self._env(pod).get("NVIDIA_VISIBLE_DEVICES", "")
        if gpu_request(pod) > 0 or dra.holds_devices(self.store, pod) or visible not in ("", "void", "none"):
            return spec.faults.runtime_error
        return ""

    # -- the kubelet's faults of the tool: images, container config, programs ----------------
    def _lacks(self, pod: dict[str, Any], program: str) -> bool:
        image = ((pod["spec"].get("containers") or [{}])[0]).get("image", "")
        return program.rsplit("/", 1)[-1] in self.image_lacks.get(image, set())

    def _shell_missing(self, pod: dict[str, Any]) -> str:
        """The program a shell-wrapped command calls that its image lacks ('' if none)."""
        argv = self._argv(pod)
        if len(argv) < 3 or argv[0].rsplit("/", 1)[-1] not in SHELLS or argv[1] != "-c":
            return ""
        words = argv[2].split()
        return words[0] if words and self._lacks(pod, words[0]) else ""

    @staticmethod
    def _waiting(pod: dict[str, Any]) -> tuple[str, str] | None:
        for cs in pod["status"].get("containerStatuses") or []:
            w = (cs.get("state") or {}).get("waiting")
            if w:
                return w.get("reason", ""), w.get("message", "")
        return None

    def _container_fault(self, pod: dict[str, Any], key: tuple[str, str], now: float) -> tuple[str, str] | None:
        """Why the kubelet cannot start the pod's containers yet: (waiting reason, message), or None.
        The image comes first (pulled before the container is configured), then volumes, then
        the environment. https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-state-waiting"""
        containers = pod["spec"].get("containers") or []
        for c in containers:
            image = c.get("image", "")
            if not valid_image(image):
                return ("InvalidImageName", f'Failed to apply default image tag "{image}": couldn\'t parse image '
                        f'name "{image}": invalid reference format')
            if image in self.missing_images:
                # Each failed pull is ErrImagePull; between pulls the kubelet backs off (10s, doubling to
                # 5 min) and says ImagePullBackOff. https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff
                attempts, last, nxt = self._pulls.get(key, (0, now, now))
                if now >= nxt:
                    attempts, last = attempts + 1, now
                    self._pulls[key] = (attempts, last, now + min(300.0, 10.0 * 2 ** (attempts - 1)))
                if last == now:
                    return ("ErrImagePull", f'rpc error: code = NotFound desc = failed to pull and unpack image '
                            f'"{image}": failed to resolve reference "{image}": {image}: not found')
                return "ImagePullBackOff", f'Back-off pulling image "{image}"'
        ns = key[0]
        for v in pod["spec"].get("volumes") or []:
            for plural, field in (("configmaps", "configMap"), ("secrets", "secret")):
                src = v.get(field)
                if src is None or src.get("optional"):
                    continue
                name = src.get("name") or src.get("secretName") or ""
                if self.store.peek(plural, ns, name) is None:
                    return "ContainerCreating", ""  # MountVolume.SetUp fails until the object exists
        for c in containers:
            for ref in c.get("envFrom") or []:
                for kind, plural, field in (("configmap", "configmaps", "configMapRef"), ("secret", "secrets", "secretRef")):
                    src = ref.get(field)
                    if src and not src.get("optional") and self.store.peek(plural, ns, src.get("name", "")) is None:
                        return "CreateContainerConfigError", f'{kind} "{src.get("name", "")}" not found'
            for env in c.get("env") or []:
                vf = env.get("valueFrom") or {}
                for kind, label, plural, field in (("configmap", "ConfigMap", "configmaps", "configMapKeyRef"),
                                                   ("secret", "Secret", "secrets", "secretKeyRef")):
                    src = vf.get(field)
                    if not src or src.get("optional"):
                        continue
                    obj = self.store.peek(plural, ns, src.get("name", ""))
                    if obj is None:
                        return "CreateContainerConfigError", f'{kind} "{src.get("name", "")}" not found'
                    if src.get("key") not in (obj.get("data") or {}):
                        return ("CreateContainerConfigError",
                                f"couldn't find key {src.get('key')} in {label} {ns}/{src.get('name', '')}")
        return None

    def _wait(self, pod: dict[str, Any], now: float, reason: str, message: str) -> None:
        """The pod is accepted by the kubelet (startTime is set before any image is pulled) but its
        container waits. https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase"""
        containers = pod["spec"].get("containers") or [{}]
        unready = f"containers with unready status: [{' '.join(c.get('name', 'main') for c in containers)}]"
        st = pod["status"]
        st.setdefault("startTime", iso(now))
        st.setdefault("hostIP", "10.0.0.1")
        st["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(now)},
                            {"type": "Initialized", "status": "True", "lastTransitionTime": iso(now)},
                            *({"type": t, "status": "False", "reason": "ContainersNotReady", "message": unready,
                               "lastTransitionTime": iso(now)} for t in ("ContainersReady", "Ready"))]
        waiting = {"reason": reason, **({"message": message} if message else {})}
        st["containerStatuses"] = [{"name": c.get("name", "main"), "image": c.get("image", ""), "imageID": "",
                                    "ready": False, "started": False, "restartCount": 0,
                                    "state": {"waiting": waiting}, "lastState": {}} for c in containers]

    def _planned_finish(self, pod: dict[str, Any], now: float) -> float | None:
        if self._shell_missing(pod):
            return now + 1.0
        if self._is_pair(pod):
            return None  # the pair's gang decides when both end
        if self._is_check(pod):
            spec = self.specs.get(pod["spec"]["nodeName"])
            if spec and spec.faults.hung_check:
                return None
            return now + self.fleet.check_seconds
        if self._is_gpu_reset(self._argv(pod)):
            return now + 20.0
        if self._argv(pod)[:2] == ["sweeper", "evidence"]:
            return now + 30.0  # dmesg, the journal, nvidia-smi -q and nvlink -s, packed
        argv = self._last_command(self._argv(pod))
        prog = argv[0].rsplit("/", 1)[-1] if argv else ""
        if prog == "dcgmi":
            return now + tools.DCGM_SECONDS[min(max(tools.dcgm_level(argv), 1), 4)]
        if prog == "all_reduce_perf":
            return now + tools.NCCL_SECONDS
        if prog == "mpirun":
            return now + tools.NCCL_PAIR_SECONDS
        if prog in ("true", "false", "echo"):
            return now + 1.0
        if prog == "nsenter":
            return now + 5.0
        if prog == "nvidia-smi":
            return now + 20.0
        if prog == "sleep" and len(argv) > 1:
            return None if argv[1] in ("inf", "infinity") else now + float(argv[1])
        run = (pod["metadata"].get("annotations") or {}).get(RUN_SECONDS)
        return None if run is None else now + float(run)

    @staticmethod
    def _last_command(argv: list[str]) -> list[str]:
        """What a `sh -c "a && exec b ..."` wrapper ends by running (b's words); else argv itself."""
        if len(argv) < 3 or argv[0].rsplit("/", 1)[-1] not in SHELLS or argv[1] != "-c":
            return argv
        last = re.split(r"&&|;|\|\|", argv[2])[-1].split()
        return last[1:] if last[:1] == ["exec"] else last

    @staticmethod
    def _argv(pod: dict[str, Any]) -> list[str]:
        c = (pod["spec"].get("containers") or [{}])[0]
        return list(c.get("command") or []) + list(c.get("args") or [])

    @staticmethod
    def _is_check_pod(pod: dict[str, Any]) -> bool:
        return (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "sweeper"

    def _is_check(self, pod: dict[str, Any]) -> bool:
        argv = self._argv(pod)
        return len(argv) >= 2 and argv[0].endswith("sweeper") and "check" in argv[1:2]

    def _terminate(self, pod: dict[str, Any], now: float, exit_code: int, reason: str, message: str,
                   log: str) -> None:
        policy = ((pod["spec"].get("containers") or [{}])[0]).get("terminationMessagePolicy", "File")
        if not message and exit_code != 0 and policy == "FallbackToLogsOnError":
            message = "\n".join(log.splitlines()[-80:])[-2048:]
        started = pod["status"].get("startTime", iso(now))
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        for cs in pod["status"].get("containerStatuses") or []:
            cs["ready"] = False
            cs["started"] = False
            cs["state"] = {"terminated": {"exitCode": exit_code, "reason": reason, "message": message[:4096],
                                          "startedAt": started, "finishedAt": iso(now),
                                          "containerID": cs.get("containerID", "")}}
        for cond in pod["status"].get("conditions") or []:
            if cond["type"] in ("Ready", "ContainersReady"):
                cond["status"] = "False"
                cond["reason"] = "PodCompleted"
        self._finish.pop((pod["metadata"]["namespace"], pod["metadata"]["name"]), None)

    # -- the pair program: two pods of an Indexed Job that run as one gang -----------------------
    def _is_pair(self, pod: dict[str, Any]) -> bool:
        argv = self._argv(pod)
        return bool(argv) and argv[0].rsplit("/", 1)[-1] == "pair-allreduce"

    @staticmethod
    def _env(pod: dict[str, Any]) -> dict[str, str]:
        """Container 0's environment as the kubelet builds it: literal values with $(VAR) references
        to earlier variables expanded, and downward API fields.
        https://kubernetes.io/docs/tasks/inject-data-application/define-interdependent-environment-variables/"""
        env: dict[str, str] = {}
        for e in ((pod["spec"].get("containers") or [{}])[0]).get("env") or []:
            name = e.get("name", "")
            if "value" in e or not e.get("valueFrom"):
                env[name] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                   lambda m: env.get(m.group(1), m.group(0)), str(e.get("value") or ""))
                continue
            path = ((e["valueFrom"].get("fieldRef") or {}).get("fieldPath")) or ""
            m = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
            if m:
                env[name] = str((pod["metadata"].get(m.group(1)) or {}).get(m.group(2), ""))
            elif path in ("metadata.name", "metadata.namespace"):
                env[name] = str(pod["metadata"].get(path.split(".")[1], ""))
            elif path == "spec.nodeName":
                env[name] = str(pod["spec"].get("nodeName", ""))
            elif path == "status.podIP":
                env[name] = str(pod["status"].get("podIP", ""))
        return env

    @staticmethod
    def _started_at(pod: dict[str, Any]) -> float:
        for cs in pod["status"].get("containerStatuses") or []:
            running = (cs.get("state") or {}).get("running")
            if running and running.get("startedAt"):
                return parse_iso(running["startedAt"])
        return parse_iso(pod["status"]["startTime"])

    def _pair_step(self, pod: dict[str, Any], key: tuple[str, str], node_name: str, now: float) -> None:
        """The kubelet's view of one pair pod: it waits (Running) until every index of its Job runs,
        then the gang's outcome is drawn once and each pod ends at its set time; a pod whose peer
        has not come within PAIR_RDZV_TIMEOUT ends with torchrun's rendezvous timeout (exit 2)."""
        uid = (pod["metadata"].get("labels") or {}).get("controller-uid", "")
        index = completion_index(pod)
        outcome = self._pair_outcomes.get(uid) if uid else None
        if outcome is None and uid:
            job = self.store.peek("jobs", key[0], (pod["metadata"].get("labels") or {}).get("job-name", ""))
            size = int(((job or {}).get("spec") or {}).get("completions") or 2)
            running = {completion_index(p): p for p in self.store.iter("pods")
                       if (p["metadata"].get("labels") or {}).get("controller-uid") == uid
                       and p["status"].get("phase") == "Running" and self._is_pair(p)}
            if len(running) >= size and all(i in running for i in range(size)) and size >= 2:
                outcome = self._pair_outcome([running[i] for i in range(size)], now)
                self._pair_outcomes[uid] = outcome
        mine = outcome.get(index) if outcome is not None and index is not None else None
        if mine is not None:
            finish_at, exit_code, log = mine
            if now < finish_at:
                return
        else:
            env = self._env(pod)
            try:
                timeout = float(env.get("PAIR_RDZV_TIMEOUT") or tools.RDZV_TIMEOUT)
            except ValueError:
                timeout = tools.RDZV_TIMEOUT
            if now < self._started_at(pod) + timeout:
                return
            exit_code, log = 2, tools.rendezvous_timeout(self._peer_name(pod), timeout, completion_index(pod) or 0)
        self.logs[key] = log
        self.store.mutate("pods", *key, partial(self._terminate, now=now, exit_code=exit_code,
                                                reason="Completed" if exit_code == 0 else "Error", message="",
                                                log=log))

    def _fabric_factor(self, spec: NodeSpec) -> float:
        """The share of a healthy pair's bandwidth this node's fabric gives: its working devices,
        its links' rate, and GPUDirect RDMA (without it NCCL stages through host memory)."""
        hw = HARDWARE[spec.instance_type]
        f = spec.faults
        nics = hw["nics"] or 1
        working = max(0, nics - f.nics_missing - len({p for p in f.nic_port_down if p < nics})) / nics
        factor = working * f.link_degraded
        if f.gpudirect_off or (f.no_peermem and hw["nic"] in ("efa", "ib")):
            factor *= 0.25
        return factor

    def _pair_outcome(self, pods: list[dict[str, Any]], now: float) -> dict[int, tuple[float, int, str]]:
        """Both ranks' end: when, exit code and log. The bus bandwidth is the healthy pair peak times
        the slower node's fabric factor, with a few percent of noise drawn from the fleet's seed and
        the pair's count of runs, so a seed replays the same story."""
        nodes = [p["spec"]["nodeName"] for p in pods]
        env = self._env(pods[0])
        hosts = [p["spec"].get("hostname") or p["metadata"]["name"] for p in pods]
        rng, hws, aborted, table = self._fabric_run(nodes, (hosts[0], hosts[1]), env.get("PAIR_GPUS") or "",
                                                    env.get("PAIR_MAX_BYTES"), self._on_fabric(pods[:2]))
        finish = self._started_at(max(pods, key=self._started_at)) + tools.NCCL_PAIR_SECONDS * (
            rng.uniform(0.3, 0.8) if aborted else 1.0)
        finish = max(finish, now)
        out: dict[int, tuple[float, int, str]] = {}
        for i, pod in enumerate(pods[:2]):
            peer = pods[1 - i]
            log = self._pair_probes(pod, nodes[i], peer, rng)
            if aborted:
                log += (table if i == 0 else "") + tools.net_error(hws[i]["nic"], nodes[i], rng.randrange(8),
                                                                   peer["status"].get("podIP", ""))
            else:
                log += table if i == 0 else f"# pair-allreduce rank {i} done\n"
            forged = self.specs[nodes[i]].faults
            if forged.forged_output:  # a node taken over prints its own rank's log, whatever the gang did
                out[i] = (finish, forged.forged_exit, forged.forged_output)
                continue
            out[i] = (finish, 1 if aborted else 0, log)
        return out

    def _on_fabric(self, pods: list[dict[str, Any]]) -> bool:
        """Whether every pod of a pair holds its node's fabric devices: NCCL reaches EFA or InfiniBand
        only through the devices its pod was given; without them it falls back to TCP sockets."""
        for p in pods:
            spec = self.specs.get(p["spec"].get("nodeName", ""))
            wanted = HARDWARE[spec.instance_type]["fabric_resources"] if spec else {}
            got = extended_requests(p)
            if any(got.get(res, 0) < 1 for res in wanted):
                return False
        return True

    def _fabric_run(self, nodes: list[str], hosts: tuple[str, str], gpus_text: str, max_bytes_text: str | None,
                    on_fabric: bool = True) -> tuple[random.Random, list[dict[str, Any]], bool, str]:
        """One two-node all-reduce between `nodes` (the pair-allreduce gang's, or an MPIJob's two
        workers'): its noise stream, the nodes' hardware, whether a flapping port aborted it, and
        rank 0's table. The bus bandwidth at the largest size is the healthy pair peak times the
        slower node's fabric factor, with a few percent of noise from the fleet's seed and the
        pair's count of runs."""
        specs = [self.specs[n] for n in nodes]
        pair = (min(nodes[0], nodes[1]), max(nodes[0], nodes[1]))
        self._pair_runs[pair] = self._pair_runs.get(pair, 0) + 1
        rng = random.Random(f"{self.fleet.seed}/pair/{pair[0]}/{pair[1]}/{self._pair_runs[pair]}")
        hws = [HARDWARE[s.instance_type] for s in specs]
        factor = min(self._fabric_factor(s) for s in specs)
        aborted = False
        if any(s.faults.port_flapping for s in specs):
            factor *= rng.uniform(0.15, 0.9)
            aborted = rng.random() < 0.35
        peak = min(hw["nccl_pair_peak"] for hw in hws)
        if not on_fabric:  # NCCL's TCP sockets on the primary interface: a few GB/s, whatever the fabric
            peak, factor = TCP_PAIR_BUSBW, 1.0
        busbw = peak * factor * rng.uniform(0.97, 1.03)
        max_bytes = tools.parse_bytes(max_bytes_text)
        gpus = int(gpus_text) if gpus_text.isdigit() else hws[0]["gpus"] - specs[0].faults.missing_gpus
        stop_at = 2 ** rng.randint(20, max(20, max_bytes.bit_length() - 1)) if aborted else None
        table, _ = tools.pair_table(hosts, hws[0]["model"], max(gpus, 1), busbw, max_bytes, rng,
                                    wrong=any(s.faults.fabric_corrupt for s in specs), stop_at=stop_at)
        return rng, hws, aborted, table

    # -- the MPI Operator (kubeflow.org/v2beta1 MPIJob), where the fleet installs it -------------------
    # What its controller makes for an MPIJob <name>, and how it reports it, as
    # https://github.com/kubeflow/mpi-operator does (pkg/controller/mpi_job_controller.go and
    # mpi_job_controller_status.go): worker pods <name>-worker-<i> (hostname, subdomain <name>-worker, a
    # headless Service of that name), the hostfile ConfigMap <name>-config, the ssh Secret <name>-ssh,
    # then the launcher Job <name>-launcher (at once, or with launcherCreationPolicy WaitForWorkersReady
    # once every worker runs), all owned by the MPIJob. Conditions Created (MPIJobCreated), Running
    # (MPIJobRunning: the launcher and every worker run), Succeeded (MPIJobSucceeded) or Failed (the
    # launcher Job's own reason, e.g. DeadlineExceeded or BackoffLimitExceeded, else MPIJobFailed).
    def _mpijobs(self, now: float) -> None:
        if not self.fleet.mpi_operator:
            return
        for mj in self.store.iter("mpijobs"):
            ns, name = mj["metadata"]["namespace"], mj["metadata"]["name"]
            spec = mj.get("spec") or {}
            run = spec.get("runPolicy") or {}
            status = mj.get("status") or {}
            if not status.get("conditions"):
                self._mpi_dependents(mj)
                self._mpi_status(mj, "Created", "MPIJobCreated", f"MPIJob {ns}/{name} is created.", now,
                                 startTime=iso(now))
                continue
            if self._mpi_finished(mj):
                ttl = run.get("ttlSecondsAfterFinished")
                if ttl is not None and now >= parse_iso(status.get("completionTime") or iso(now)) + float(ttl):
                    self.store.delete("mpijobs", ns, name)
                continue
            replicas = spec.get("mpiReplicaSpecs") or {}
            if not ((replicas.get("Launcher") or {}).get("template") or {}).get("spec"):
                continue  # the operator's validation refuses it (an Event, in the real one); nothing runs
            count = int((replicas.get("Worker") or {}).get("replicas") or 0)
            workers = []
            for i in range(count):
                w = self.store.peek("pods", ns, f"{name}-worker-{i}")
                if w is None:
                    self._mpi_worker(mj, i)
                workers.append(w)
            running = [w for w in workers if w is not None and w["status"].get("phase") == "Running"]
            launcher = self.store.peek("jobs", ns, f"{name}-launcher")
            if launcher is None:
                if spec.get("launcherCreationPolicy", "AtStartup") == "AtStartup" or len(running) == count:
                    self._mpi_launcher(mj)
                continue
            cond = next((c for c in (launcher.get("status") or {}).get("conditions") or []
                         if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None)
            if cond is not None:
                if cond["type"] == "Complete":
                    self._mpi_status(mj, "Succeeded", "MPIJobSucceeded", f"MPIJob {ns}/{name} successfully completed.",
                                     now, completionTime=iso(now))
                else:
                    self._mpi_status(mj, "Failed", cond.get("reason") or "MPIJobFailed",
                                     cond.get("message") or f"MPIJob {ns}/{name} has failed", now,
                                     completionTime=iso(now))
                policy = run.get("cleanPodPolicy", "None")
                for w in workers:  # cleanPodPolicy: Running deletes the workers still running (or pending)
                    if w is not None and (policy == "All" or (policy == "Running" and w["status"].get("phase")
                                                              not in TERMINAL)):
                        self.store.delete("pods", ns, w["metadata"]["name"])
                continue
            uid = launcher["metadata"]["uid"]
            launching = any((p["metadata"].get("labels") or {}).get("controller-uid") == uid
                            and p["status"].get("phase") == "Running" for p in self.store.iter("pods"))
            if launching and len(running) == count and not self._mpi_condition(mj, "Running"):
                self._mpi_status(mj, "Running", "MPIJobRunning", f"MPIJob {ns}/{name} is running.", now)

    @staticmethod
    def _mpi_condition(mj: dict[str, Any], kind: str) -> bool:
        return any(c["type"] == kind and c["status"] == "True" for c in (mj.get("status") or {}).get("conditions") or [])

    def _mpi_finished(self, mj: dict[str, Any]) -> bool:
        return self._mpi_condition(mj, "Succeeded") or self._mpi_condition(mj, "Failed")

    def _mpi_status(self, mj: dict[str, Any], kind: str, reason: str, message: str, now: float, **extra: Any) -> None:
        """Set one condition (a finished MPIJob's Running turns False, as the operator's setCondition does)."""
        def change(o: dict[str, Any]) -> None:
            st = o.setdefault("status", {})
            conds = [c for c in st.get("conditions") or [] if c["type"] != kind]
            if kind in ("Succeeded", "Failed"):
                for c in conds:
                    if c["type"] == "Running":
                        c["status"] = "False"
            conds.append({"type": kind, "status": "True", "reason": reason, "message": message,
                          "lastUpdateTime": iso(now), "lastTransitionTime": iso(now)})
            st["conditions"] = conds
            for k, v in extra.items():
                st.setdefault(k, v)
        self.store.mutate("mpijobs", mj["metadata"]["namespace"], mj["metadata"]["name"], change)

    @staticmethod
    def _mpi_owner(mj: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": mj["metadata"]["name"],
                 "uid": mj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]

    @staticmethod
    def _mpi_labels(name: str, role: str) -> dict[str, str]:
        return {MPI_OPERATOR: "mpi-operator", MPI_JOB_NAME: name, MPI_ROLE: role}

    def _mpi_dependents(self, mj: dict[str, Any]) -> None:
        """The workers' headless Service, the hostfile ConfigMap and the ssh Secret."""
        ns, name = mj["metadata"]["namespace"], mj["metadata"]["name"]
        spec = mj.get("spec") or {}
        count = int(((spec.get("mpiReplicaSpecs") or {}).get("Worker") or {}).get("replicas") or 0)
        slots = int(spec.get("slotsPerWorker") or 1)
        meta = {"labels": {"app": name}, "ownerReferences": self._mpi_owner(mj)}
        hostfile = "".join(f"{name}-worker-{i}.{name}-worker.{ns}.svc slots={slots}\n" for i in range(count))
        made: tuple[tuple[str, dict[str, Any]], ...] = (
                ("services", {"metadata": {"name": f"{name}-worker", **meta},
                              "spec": {"clusterIP": "None", "selector": self._mpi_labels(name, "worker")}}),
                ("configmaps", {"metadata": {"name": f"{name}-config", **meta}, "data": {"hostfile": hostfile}}),
                ("secrets", {"metadata": {"name": f"{name}-ssh", **meta}, "type": "kubernetes.io/ssh-auth",
                             "data": {"ssh-privatekey": "", "ssh-publickey": ""}}))
        for plural, obj in made:
            if self.store.peek(plural, ns, obj["metadata"]["name"]) is None:
                self.store.create(plural, ns, obj)

    def _mpi_worker(self, mj: dict[str, Any], index: int) -> None:
        ns, name = mj["metadata"]["namespace"], mj["metadata"]["name"]
        tmpl = ((mj["spec"].get("mpiReplicaSpecs") or {}).get("Worker") or {}).get("template") or {}
        meta = tmpl.get("metadata") or {}
        pod_spec = copy.deepcopy(tmpl.get("spec") or {})
        pod_spec.update({"hostname": f"{name}-worker-{index}", "subdomain": f"{name}-worker"})
        pod = {"metadata": {"name": f"{name}-worker-{index}",
                            "labels": {**(meta.get("labels") or {}), **self._mpi_labels(name, "worker"),
                                       MPI_INDEX: str(index)},
                            "annotations": dict(meta.get("annotations") or {}), "ownerReferences": self._mpi_owner(mj)},
               "spec": pod_spec, "status": {"phase": "Pending"}}
        if not self.admit_pod(ns, pod):
            self.store.create("pods", ns, pod)

    def _mpi_launcher(self, mj: dict[str, Any]) -> None:
        """The launcher Job: runPolicy's backoffLimit, activeDeadlineSeconds and ttlSecondsAfterFinished."""
        ns, name = mj["metadata"]["namespace"], mj["metadata"]["name"]
        run = mj["spec"].get("runPolicy") or {}
        tmpl = copy.deepcopy(((mj["spec"].get("mpiReplicaSpecs") or {}).get("Launcher") or {}).get("template") or {})
        meta = tmpl.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **self._mpi_labels(name, "launcher")}
        job_spec: dict[str, Any] = {"completions": 1, "parallelism": 1, "backoffLimit": run.get("backoffLimit", 6),
                                    "template": tmpl}
        for key in ("activeDeadlineSeconds", "ttlSecondsAfterFinished"):
            if run.get(key) is not None:
                job_spec[key] = run[key]
        self.store.create("jobs", ns, {"metadata": {"name": f"{name}-launcher", "labels": {"app": name},
                                                    "ownerReferences": self._mpi_owner(mj)}, "spec": job_spec})

    def _collect(self, uid: str) -> None:
        """The garbage collector's cascade for an MPIJob: what it owns goes, and what those own
        (the launcher Job's pods)."""
        for plural in ("jobs", "pods", "services", "configmaps", "secrets"):
            for obj in list(self.store.iter(plural)):
                meta = obj["metadata"]
                owned = any(o.get("uid") == uid for o in meta.get("ownerReferences") or [])
                if owned and self.store.peek(plural, meta.get("namespace"), meta["name"]) is not None:
                    self.store.delete(plural, meta.get("namespace"), meta["name"])
                    if plural == "jobs":
                        self._collect(meta["uid"])

    def _mpirun(self, pod: dict[str, Any]) -> tuple[int, str, str]:
        """The launcher's `mpirun -np N ... <program>` over its MPIJob's two workers: the all-reduce's
        table in nccl-tests' shape for the workers' nodes, from the same fabric model as the
        pair-allreduce gang (no path-MTU probes in this form). Workers not running: ssh cannot reach
        them and mpirun gives up, in Open MPI's words."""
        ns = pod["metadata"]["namespace"]
        name = (pod["metadata"].get("labels") or {}).get(MPI_JOB_NAME, "")
        workers = sorted((p for p in self.store.iter("pods")
                          if p["metadata"]["namespace"] == ns and (p["metadata"].get("labels") or {}).get(MPI_JOB_NAME)
                          == name and (p["metadata"].get("labels") or {}).get(MPI_ROLE) == "worker"
                          and p["status"].get("phase") == "Running"), key=lambda p: p["metadata"]["name"])
        if len(workers) < 2:
            return 1, ("ssh: Could not resolve hostname " + f"{name}-worker-{len(workers)}.{name}-worker.{ns}.svc: "
                       "Name or service not known\n--------------------------------------------------------------------"
                       "------\nORTE was unable to reliably start one or more daemons.\n"), ""
        argv = self._argv(pod)
        np_ = argv[argv.index("-np") + 1] if "-np" in argv[:-1] else ""
        gpus = str(int(np_) // 2) if np_.isdigit() else ""
        max_bytes = argv[argv.index("--max-bytes") + 1] if "--max-bytes" in argv[:-1] else None
        if max_bytes is None and "-e" in argv[:-1]:  # nccl-tests' own -e MAXBYTES
            max_bytes = argv[argv.index("-e") + 1]
        nodes = [w["spec"]["nodeName"] for w in workers[:2]]
        hosts = (workers[0]["spec"].get("hostname") or "", workers[1]["spec"].get("hostname") or "")
        rng, hws, aborted, table = self._fabric_run(nodes, hosts, gpus, max_bytes, self._on_fabric(workers[:2]))
        if aborted:
            return 1, table + tools.net_error(hws[0]["nic"], nodes[0], rng.randrange(8),
                                              workers[1]["status"].get("podIP", "")), ""
        return 0, table, ""

    def _peer_name(self, pod: dict[str, Any]) -> str:
        """The other index's DNS name through the headless Service, as the program works it out:
        PAIR_PEER if set, else <job>-<other index>.<subdomain> (one pod template serves both
        indexes, so it cannot name the peer itself)."""
        env = self._env(pod)
        if env.get("PAIR_PEER") and "$(" not in env["PAIR_PEER"]:
            return env["PAIR_PEER"]
        job = env.get("PAIR_JOB") or (pod["metadata"].get("labels") or {}).get("job-name", "")
        sub = env.get("PAIR_SERVICE") or pod["spec"].get("subdomain")
        return f"{job}-{1 - (completion_index(pod) or 0)}" + (f".{sub}" if sub else "")

    def _pair_probes(self, pod: dict[str, Any], node_name: str, peer: dict[str, Any] | None, rng: Any) -> str:
        """The path-MTU probes toward the peer, one per PAIR_IFACES interface: the local interface's
        MTU is this node's (the `mtu` fault), the path's the smaller `path_mtu` of the two nodes."""
        env = self._env(pod)
        spec = self.specs[node_name]
        hw = HARDWARE[spec.instance_type]
        try:
            mtu = int(env.get("PAIR_MTU") or tools.IFACE_MTU.get(hw["nic"], 1500))
        except ValueError:
            mtu = 1500
        peer_name = self._peer_name(pod)
        peer_ip = peer["status"].get("podIP") if peer is not None else None
        peer_spec = self.specs.get(peer["spec"].get("nodeName", "")) if peer is not None else None
        out = []
        if not env.get("PAIR_MTU"):
            return ""  # no MTU to probe: the program skips the probes
        for iface in env.get("PAIR_IFACES", "").split():
            limits = [s.faults.path_mtu[iface] for s in (spec, peer_spec) if s is not None and iface in s.faults.path_mtu]
            code, text = tools.ping_probe(iface, mtu, peer_name, peer_ip, pod["status"].get("podIP", "10.1.0.1"),
                                          spec.faults.mtu or tools.IFACE_MTU.get(hw["nic"], 1500),
                                          min(limits) if limits else None, rng.uniform(0.03, 0.08))
            out.append(tools.mtu_section(iface, mtu, peer_name, code, text))
        return "".join(out)

    # -- the programs pods run ------------------------------------------------------
    def _run(self, pod: dict[str, Any], node_name: str, now: float) -> tuple[int, str, str]:
        """(exit code, log, termination message) of a pod's main container."""
        missing = self._shell_missing(pod)
        if missing:
            return 127, f"sh: 1: {missing}: not found\n", ""  # the shell's "command not found"
        if self._argv(pod)[:2] == ["sweeper", "evidence"]:
            return self._evidence(pod, node_name, now)
        if not self._is_check(pod) and self._is_gpu_reset(self._argv(pod)):
            if not self._sees_gpus(pod):
                return 127, "sh: 1: nvidia-smi: not found\n", ""  # no NVIDIA runtime put it in the container
            return self._gpu_reset(node_name, self._argv(pod), self._env(pod))
        if not self._is_check(pod):
            argv = self._last_command(self._argv(pod))
            prog = argv[0].rsplit("/", 1)[-1] if argv else ""
            spec = self.specs.get(node_name)
            if spec and spec.faults.forged_output and prog in ("dcgmi", "all_reduce_perf"):
                return spec.faults.forged_exit, spec.faults.forged_output, ""
            if prog == "dcgmi" and spec:
                image = ((pod["spec"].get("containers") or [{}])[0]).get("image", "")
                builds = self.fleet.cuda_builds.get(image)
                code, out = tools.dcgm_output(spec, tools.dcgm_level(argv), builds)
                return code, out + "\n", ""
            if prog == "all_reduce_perf" and spec:
                code, out = tools.nccl_output(spec, node_name)
                return code, out, ""
            if prog == "mpirun":
                return self._mpirun(pod)
            if prog == "nvidia-smi" and spec and "-q" in argv:
                if not self._sees_gpus(pod):
                    return 127, "sh: 1: nvidia-smi: not found\n", ""  # no NVIDIA runtime put it in the container
                code, out = tools.nvidia_smi_q(self.fake_nvml(node_name, now), argv, now)
                return code, out, ""
            if prog == "false":
                return 1, "", ""
            if prog == "nsenter" and "reboot" in argv:
                self._reboot_node(node_name, now)
                return 137, "", "the node rebooted"
            if prog == "echo":
                return 0, " ".join(argv[1:]) + "\n", ""
            return 0, "" if prog in ("true", "sleep") else "training finished\n", ""
        spec = self.specs.get(node_name)
        faults = spec.faults if spec else None
        if faults and (faults.forged_output or faults.forged_summary):
            return faults.forged_exit, faults.forged_output, faults.forged_summary
        if faults and faults.garbage_output:
            return 0, "NVRM: API mismatch\x1b[0m ]]} <<garbage>> 0xdeadbeef\n", ""
        if faults and faults.check_crash:
            return 139, "Segmentation fault (core dumped)\n", ""
        argv = self._argv(pod)
        try:
            opts = CheckOptions.from_argv(argv[2:])
        except (argparse.ArgumentError, ValueError) as exc:
            return 2, f"sweeper check: error: {exc}\n", ""
        if not opts.node:
            opts = CheckOptions(**{**opts.__dict__, "node": node_name})
        boot = self._boot(node_name)
        nvml = self.fake_nvml(node_name, now) if self._sees_gpus(pod) else FakeNvml(library_present=False)
        result = run_node_checks(opts, nvml, self.kernel_log(node_name, now),
                                 now=now, uptime=now - boot, host=self.fake_host(node_name, now, self._host_paths(pod)))
        exit_code = 0 if result.status in ("pass", "warn", "skip") else 1
        return exit_code, result.to_json() + "\n", result.summary()

    def _evidence(self, pod: dict[str, Any], node_name: str, now: float) -> tuple[int, str, str]:
        """`sweeper evidence`: the real collector on the node's fake host; its bundle in the log."""
        argv = self._argv(pod)
        try:
            cap = int(argv[argv.index("--max-bytes") + 1]) if "--max-bytes" in argv else evidence.DEFAULT_CAP
        except (ValueError, IndexError):
            return 2, "sweeper evidence: error: --max-bytes\n", ""
        spec = self.specs.get(node_name)
        if spec and spec.faults.forged_evidence:
            return 0, evidence.emit(sim_evidence.forged(spec.faults.forged_evidence)), ""
        nvml = self.fake_nvml(node_name, now) if self._sees_gpus(pod) else None
        host = sim_evidence.EvidenceHost(self.fake_host(node_name, now, self._host_paths(pod)), nvml,
                                         self.kernel_log(node_name, now), now)
        got = evidence.collect(host, node_name, cap, now=now)  # type: ignore[arg-type]
        return 0, evidence.emit(got.bundle), ""

    def _sees_gpus(self, pod: dict[str, Any]) -> bool:
        """A pod that requests GPUs gets them from the device plugin. One that requests none sees them
        only through NVIDIA's runtime with NVIDIA_VISIBLE_DEVICES=all: its RuntimeClass's handler, else
        the node's default runtime (`nvidia` on EKS's and AKS's GPU images, `runc` on GKE's).
        https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/docker-specialized.html"""
        rc = pod["spec"].get("runtimeClassName")
        handler = (self.store.peek("runtimeclasses", None, rc) or {}).get("handler") if rc else \
            self.fleet.default_runtime
        env = {e.get("name"): e.get("value") for c in pod["spec"].get("containers") or [] for e in c.get("env") or []}
        if gpu_request(pod) > 0 or dra.holds_devices(self.store, pod):
            # The device plugin (or the DRA driver, through CDI) hands over the device nodes; the driver's libraries come from NVIDIA's
            # runtime hook, or under runc on GKE from the device plugin's mount at /usr/local/nvidia,
            # found only on the container's library path (https://cloud.google.com/kubernetes-engine/
            # docs/how-to/gpus#cuda).
            return handler == "nvidia" or "/usr/local/nvidia" in str(env.get("LD_LIBRARY_PATH") or "")
        return handler == "nvidia" and env.get("NVIDIA_VISIBLE_DEVICES") == "all"

    @staticmethod
    def _is_gpu_reset(argv: list[str]) -> bool:
        """nvidia-smi -r / --gpu-reset, alone or in a shell script."""
        return re.search(r"nvidia-smi\b[^;&|\n]*\s(?:-r|--gpu-reset)\b", " ".join(argv)) is not None

    def _gpu_reset(self, node_name: str, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """nvidia-smi's reset, as a script runs it: `-pm 0` on the GPUs first (a GPU in persistence
        mode is held by nvidia-persistenced, and the reset refuses it: NVIDIA/gpu-operator#118,
        NVIDIA/NVSentinel#1690), then `-r -i IDS`, its ids from the script or its GPU_IDS variable."""
        f = self.specs[node_name].faults
        text = " ".join(argv)
        reset = re.search(r"nvidia-smi\b[^;&|\n]*\s(?:-r|--gpu-reset)\b[^;&|\n]*", text)
        words = (reset.group(0) if reset else text).replace('"', " ").split()
        ids = words[words.index("-i") + 1] if "-i" in words[:-1] else ""
        if ids.startswith("$"):
            ids = (env or {}).get(ids.strip("${}"), "")
        gpus = {int(g) for g in ids.split(",") if g.strip().isdigit()} if ids else set(range(64))
        pm_off = reset is not None and re.search(r"-pm\s+0\b", text[:reset.start()]) is not None
        if gpus & set(f.gpu_lost):
            return 3, "", "GPU is lost: a reset cannot reach it; reboot the node\n"
        holders = self.operand_pods(node_name) if node_name in self._with_operands else []
        if holders:
            # nvidia-smi refuses to reset a GPU another process holds open: the device plugin, GFD,
            # DCGM and dcgm-exporter do (https://docs.nvidia.com/deploy/nvidia-smi/index.html, -r).
            g = min(gpus)
            return 255, "", (f"GPU 00000000:{bus_id(g).split(':')[1]}:00.0 is currently in use by another process.\n\n"
                             "1 device is currently being used by one or more other processes (e.g., Fabric Manager, "
                             "CUDA application, graphics application such as an X server, or a monitoring "
                             "application such as another instance of nvidia-smi). Please first kill all processes "
                             "using this device and all compute applications running in the system.\n")
        if not f.persistence_off and not pm_off:
            g = min(gpus)
            return 255, "", (f"The following GPUs could not be reset:\n  GPU 00000000:{bus_id(g).split(':')[1]}:00.0: "
                             "In use by another client\n\n1 device is currently being used by one or more other "
                             "processes (e.g., Fabric Manager, CUDA application, graphics application such as an X "
                             "server, or a monitoring application such as another instance of nvidia-smi). Please "
                             "first kill all processes using this device and all compute applications running in "
                             "the system.\n")
        f.remap_pending = [g for g in f.remap_pending if g not in gpus]
        f.recovery_action = {g: a for g, a in f.recovery_action.items() if g not in gpus}
        f.ecc_dbe = {g: n for g, n in f.ecc_dbe.items() if g not in gpus}
        pm = "".join(f"Disabled persistence mode for GPU 00000000:{bus_id(g).split(':')[1]}:00.0.\n"
                     for g in sorted(gpus) if g < 8 and pm_off and not f.persistence_off)
        return 0, pm + "".join(f"GPU 00000000:{bus_id(g).split(':')[1]}:00.0 was successfully reset.\n"
                               for g in sorted(gpus) if g < 8), ""

    def reboot(self, node_name: str, now: float) -> None:
        """The node restarts: its kernel log starts again, and what a reboot clears is cleared
        (pending remaps are applied; volatile counters reset). The kubelet reports the new boot's
        ID, and no time (NodeSystemInfo.bootID,
        https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/#NodeSystemInfo)."""
        self.boots[node_name] = now
        if self.store.peek("nodes", None, node_name) is not None:
            self.store.mutate("nodes", None, node_name,
                              lambda n: n["status"]["nodeInfo"].update(bootID=str(uuid.uuid4())))
        f = self.specs[node_name].faults
        f.remap_pending = []
        f.ecc_dbe = {}
        f.recovery_action = {}
        f.gpu_lost = []

    def _boot(self, node_name: str) -> float:
        if node_name in self.boots:
            return self.boots[node_name]
        node = self.store.peek("nodes", None, node_name)
        return parse_iso(node["metadata"]["creationTimestamp"]) if node else self.started

    def fake_nvml(self, node_name: str, now: float) -> FakeNvml:
        spec = self.specs[node_name]
        hw = HARDWARE[spec.instance_type]
        f = spec.faults
        days = max(0.0, now - self.started) / 86400.0
        failed = f.ecc_fail_at is not None and now >= self.started + f.ecc_fail_at
        bad_day = fails_on(self.fleet.seed, node_name, int(days), spec.fail_rate)  # fleet `fail_rate`, `rollouts`
        serial = int(hashlib.sha1(node_name.encode()).hexdigest()[:6], 16) % 10**6
        gpus = []
        for i in range(max(0, hw["gpus"] - f.missing_gpus)):
            corrected = 3 * i + int(f.ecc_growth.get(i, 0.0) * days)
            gpus.append(FakeGpu(
                index=i, name=hw["model"], bus_id=bus_id(i), temperature=33 + (i * 7) % 9,
                memory_mib=hw["memory_mib"], persistence=not f.persistence_off,
                volatile_uncorrected=f.ecc_dbe.get(i, 0) + int(failed and i in f.ecc_growth),
                aggregate_uncorrected=f.ecc_dbe.get(i, 0) + int(failed and i in f.ecc_growth),
                volatile_corrected=int(f.ecc_growth.get(i, 0.0) * days), aggregate_corrected=corrected,
                remap_pending=i in f.remap_pending, remap_failure=i in f.remap_failure,
                remapped_corrected=int(f.remap_growth.get(i, 0.0) * days),
                remapped_uncorrected=1 if (i in f.remap_pending or i in f.remap_failure) else 0,
                nvlinks=hw["nvlinks"], nvlink_down=[3] if i in f.nvlink_down else [],
                pcie_max_gen=hw["pcie_gen"], pcie_width=8 if i in f.pcie_downtrained else 16,
                pcie_replays=100_000 if i in f.pcie_replay or (bad_day and i == 0) else 0,
                serial=f"165{serial:06d}{i:04d}",
                clock_reasons=0x1 | (0x40 if i in f.thermal else 0) | (0x8 if i in f.throttle else 0),
                margin=-5 if i in f.thermal else 38 - i, recovery_action=f.recovery_action.get(i, 0),
                lost=i in f.gpu_lost, pci_device_id=int(f"{hw.get('device_id') or '2330'}10DE", 16),
                # HGX Hopper and Blackwell baseboards join an NVSwitch fabric; the A100's NVML does not report it.
                fabric_state=(1 if f.fabric_manager_down else 3) if hw.get("nvswitch_fabric") else None))
        cuda = CUDA_OF_BRANCH.get(branch_of(spec.driver) or 0, "12.8").split(".")
        return FakeNvml(gpus=gpus, driver=spec.driver, cuda=1000 * int(cuda[0]) + 10 * int(cuda[1]))

    @staticmethod
    def _host_paths(pod: dict[str, Any]) -> frozenset[str]:
        """The host paths a pod mounts (hostPath volumes)."""
        return frozenset(str(v["hostPath"].get("path", "")) for v in pod["spec"].get("volumes") or []
                         if isinstance(v, dict) and isinstance(v.get("hostPath"), dict))

    def fake_host(self, node_name: str, now: float | None = None, mounts: frozenset[str] | None = None) -> FakeHost:
        """The node's sysfs and tools, as its hardware and faults make them; the journal only where
        the pod mounts journald's persistent directory (`mounts`; None: a test's direct call, all)."""
        spec = self.specs[node_name]
        hw = HARDWARE[spec.instance_type]
        f = spec.faults
        count = max(0, hw["nics"] - f.nics_missing)
        files: dict[str, str] = {}
        if hw["nic"] == "efa":
            # The EFA driver reports every port ACTIVE at the device's maximum rate, whatever the link
            # does (amzn-drivers, efa_verbs.c, efa_query_port): a down EFA link shows only between two
            # nodes (_fabric_factor), never in this node's sysfs.
            files.update(efa_sysfs(count, rate=hw["nic_rate"]))
            files.update(netdev("ens32", "ena", f.mtu or 9001))
        elif hw["nic"] == "ib":
            files.update(ib_sysfs(count, down=tuple(f.nic_port_down), rate=hw["nic_rate"]))
            files.update(netdev("eth0", "hv_netvsc", f.mtu or 1500))
        elif hw["nic"] in ("gve", "ena"):
            for k in range(count if spec.multi_network or hw["nic"] != "gve" else 1):
                files.update(netdev(f"eth{k}", hw["nic"], f.mtu or 8244, up=k not in f.nic_port_down))
        files.update(netdev("lo", "", 65536))
        del files["/sys/class/net/lo/device/uevent"]  # a loopback has no device behind it
        gpus = max(0, hw["gpus"] - f.missing_gpus)
        files.update(gpu_pci(gpus))
        if hw["nic"] in ("efa", "ib") and not f.no_peermem:
            files.update(peermem("efa_nv_peermem" if hw["nic"] == "efa" else "nvidia_peermem"))
        topo_nics = count if hw["nic"] == "ib" else 0  # EFA devices are not listed by topo -m on p5
        # The check image carries nvidia-smi and journalctl, and no fi_info (the host's is not run from
        # a check Job); the Job mounts journald's directories, where the journal of this boot lies.
        commands = {"nvidia-smi": (0, topo_output(gpus, hw["nvlinks"], topo_nics, "PXB", far=f.poor_affinity), ""),
                    "journalctl": (0, "", "")}
        boot = self.boot_id(node_name)
        if hw.get("nvswitch_fabric") and (mounts is None or "/var/log" in mounts):
            files["/var/log/fabricmanager.log"] = sim_evidence.fabric_manager_log(f.fabric_manager_down)
        if not f.no_journal and (mounts is None or {"/var/log/journal", "/var/log"} & mounts):
            lines = self._kernel_lines(node_name, self.clock.now() if now is None else now)
            machine = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node_name}.machine-id").hex
            files[f"/var/log/journal/{machine}/system.journal"] = journal_file(
                boot, node_name, lines, JOURNALCTL_FORMAT + 1 if f.journal_newer else JOURNALCTL_FORMAT)
        return FakeHost(files=files, commands=commands, arch=hw["arch"], environ={"NODE_NAME": node_name}, boot=boot)

    def boot_id(self, node_name: str) -> str:
        """The node's kernel boot ID: new at each boot, as the kernel makes it."""
        return uuid.uuid5(uuid.NAMESPACE_DNS, f"{node_name}.boot.{self._boot(node_name):.6f}").hex

    def kernel_log(self, node_name: str, now: float) -> str:
        """What `dmesg` prints: the ring buffer, which on a node with `ring_buffer_span` has lost
        everything older than that (the journal still has it)."""
        lines = self._kernel_lines(node_name, now)
        span = self.specs[node_name].faults.ring_buffer_span
        if span is not None:
            up = now - self._boot(node_name)
            lines = [ln for ln in lines if float(ln[1:ln.index("]")]) >= up - span]
            # What filled the buffer is still in it: a busy node's pod network churns the kernel log.
            lines.insert(0, f"[{max(up - span, 0.0) + 0.5:12.6f}] cni0: port 3(veth5e1f2a7b) entered forwarding state")
        return "\n".join(lines) + "\n"

    def _kernel_lines(self, node_name: str, now: float) -> list[str]:
        """Every kernel line of this boot, oldest first."""
        spec = self.specs[node_name]
        boot = self._boot(node_name)
        lines = [f"[{5.0:12.6f}] nvidia: loading out-of-tree module taints kernel.",
                 f"[{6.2:12.6f}] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.133.20"]
        for x in spec.faults.xids:
            when = self.started + x["at"]
            if boot <= when <= now:
                lines.append(xid_line(when - boot, x["gpu"], x["code"], x["text"] or "simulated fault"))
        storm = spec.faults.xid_storm
        if storm and boot <= self.started + storm["at"] <= now:
            t0 = self.started + storm["at"] - boot
            for k in range(storm["count"]):
                lines.append(xid_line(t0 + k * 0.01, storm["gpu"], storm["code"], "simulated storm"))
        for x in spec.faults.sxids:
            when = self.started + x["at"]
            if boot <= when <= now:
                lines.append(sxid_line(when - boot, x["switch"], x["code"], x["fatal"]))
        return sorted(lines, key=lambda ln: float(ln[1:ln.index("]")]))

    def _jobs(self, now: float) -> None:
        for job in self.store.iter("jobs"):
            status = job.setdefault("status", {})
            conds = status.get("conditions") or []
            ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
            finished = next((c for c in conds if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None)
            pods = [p for p in self.store.iter("pods")
                    if (p["metadata"].get("labels") or {}).get("controller-uid") == uid]
            if finished:
                ttl = job["spec"].get("ttlSecondsAfterFinished")
                done_at = parse_iso(status.get("completionTime") or finished["lastTransitionTime"])
                if ttl is not None and now >= done_at + ttl:
                    for p in pods:
                        self.store.delete("pods", ns, p["metadata"]["name"])
                    self.store.delete("jobs", ns, name)
                continue
            active = [p for p in pods if p["status"].get("phase") not in TERMINAL]
            succeeded = sum(1 for p in pods if p["status"].get("phase") == "Succeeded")
            failed = sum(1 for p in pods if p["status"].get("phase") == "Failed")
            start = status.get("startTime")
            new: dict[str, Any] = {"active": len(active), "succeeded": succeeded, "failed": failed,
                                   "startTime": start or iso(now)}
            indexed = job["spec"].get("completionMode") == "Indexed"
            done: set[int] = set()
            if indexed:
                # Indexed: the Job succeeds when each index 0..completions-1 has a succeeded pod, and
                # says which have in completedIndexes (intervals, "0-2,4").
                # https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode
                done = {i for p in pods if p["status"].get("phase") == "Succeeded"
                        and (i := completion_index(p)) is not None and i < int(job["spec"].get("completions") or 1)}
                succeeded = len(done)
                new["succeeded"] = succeeded
                if done:
                    new["completedIndexes"] = index_ranges(done)
            deadline = job["spec"].get("activeDeadlineSeconds")
            verdict = None
            if succeeded >= int(job["spec"].get("completions") or 1):
                verdict = ("Complete", "", "")
            elif failed > int(job["spec"].get("backoffLimit", 6)):
                verdict = ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            elif deadline is not None and start and now >= parse_iso(start) + float(deadline):
                verdict = ("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            if verdict:
                kind, reason, message = verdict
                for p in active:
                    self.store.delete("pods", ns, p["metadata"]["name"])
                new["active"] = 0
                cond = {"type": kind, "status": "True", "lastProbeTime": iso(now), "lastTransitionTime": iso(now)}
                if reason:
                    cond.update({"reason": reason, "message": message})
                    new["failed"] = failed + len(active)
                else:
                    new["completionTime"] = iso(now)
                new["conditions"] = conds + [cond]
            elif indexed and not job["spec"].get("suspend"):
                running = {completion_index(p) for p in active}
                room = int(job["spec"].get("parallelism", 1)) - len(active)
                for i in range(int(job["spec"].get("completions") or 1)):
                    if room <= 0:
                        break
                    if i in done or i in running:
                        continue
                    if not self._job_pod(job, now, index=i):
                        break
                    new["active"] += 1
                    room -= 1
            elif not active and not job["spec"].get("suspend") and self._job_pod(job, now):
                new["active"] = 1
            if any(status.get(k) != v for k, v in new.items()):
                self.store.mutate("jobs", ns, name, partial(_update_status, **new))

    def _job_pod(self, job: dict[str, Any], now: float, index: int | None = None) -> bool:
        """Create the Job's pod through admission; False if it was rejected (retried with back-off).
        An Indexed Job's pod carries its index as annotation and label, in JOB_COMPLETION_INDEX
        (from that annotation, through the downward API) and in its hostname `<job>-<index>`.
        https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode"""
        uid = job["metadata"]["uid"]
        retry = self._create_retry.get(uid)
        if retry and now < retry[0]:
            return False
        tmpl = job["spec"]["template"]
        meta = dict(tmpl.get("metadata") or {})
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        labels = dict(meta.get("labels") or {})
        labels.update({"job-name": name, "batch.kubernetes.io/job-name": name, "controller-uid": uid,
                       "batch.kubernetes.io/controller-uid": uid})
        pod = {"metadata": {"generateName": name + "-", "labels": labels,
                            "annotations": dict(meta.get("annotations") or {}),
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                                 "controller": True, "blockOwnerDeletion": True}]},
               "spec": dict(tmpl.get("spec") or {}), "status": {"phase": "Pending"}}
        prefix = name
        if index is not None:
            prefix = f"{name}-{index}"
            pod["metadata"]["generateName"] = prefix + "-"
            pod["metadata"]["annotations"][INDEX_KEY] = str(index)
            pod["metadata"]["labels"][INDEX_KEY] = str(index)
            pod["spec"] = copy.deepcopy(pod["spec"])
            pod["spec"]["hostname"] = prefix
            env_var = {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                "apiVersion": "v1", "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}}
            for c in (pod["spec"].get("initContainers") or []) + (pod["spec"].get("containers") or []):
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in c.get("env") or []):
                    c["env"] = [*(c.get("env") or []), env_var]
        ns = job["metadata"]["namespace"]
        self._pod_serial += 1  # the apiserver names a generateName pod before admission sees it
        pod["metadata"]["name"] = f"{prefix}-{hashlib.sha1(f'{uid}/{self._pod_serial}'.encode()).hexdigest()[:5]}"
        refused = self.admit_pod(ns, pod)
        if refused:
            delay = min(360.0, 2 * retry[1]) if retry else 10.0
            self._create_retry[uid] = (now + delay, delay)
            self._job_event(job, now, "FailedCreate", f"Error creating: {refused}")
            return False
        self._create_retry.pop(uid, None)
        self.store.create("pods", ns, pod)
        return True

    def admit_pod(self, namespace: str, pod: dict[str, Any]) -> str:
        """The apiserver's admission of a new pod: '' if admitted, else its 403 message.
        RuntimeClass: a pod naming a RuntimeClass that does not exist is rejected at creation
        (plugin/pkg/admission/runtimeclass, https://kubernetes.io/docs/concepts/containers/runtime-class/).
        Pod Security Admission: the namespace's pod-security.kubernetes.io/enforce level
        (https://kubernetes.io/docs/concepts/security/pod-security-admission/)."""
        what = f'pods "{pod["metadata"].get("name", "")}" is forbidden'
        rc = pod["spec"].get("runtimeClassName")
        if rc and self.store.peek("runtimeclasses", None, rc) is None:
            return f'{what}: pod rejected: RuntimeClass "{rc}" not found'
        labels = ((self.store.peek("namespaces", None, namespace) or {}).get("metadata") or {}).get("labels") or {}
        level = labels.get(POD_SECURITY, "privileged")
        if level in ("baseline", "restricted"):
            version = labels.get(f"{POD_SECURITY}-version", "latest")
            bad = pod_security_violations(pod, level)
            if bad:
                return f'{what}: violates PodSecurity "{level}:{version}": {", ".join(bad)}'
        return ""

    def _job_event(self, job: dict[str, Any], now: float, reason: str, message: str) -> None:
        """A Warning Event on the Job from the job controller, counted up when it repeats (as the
        event recorder aggregates)."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        ev_name = f"{name}.{hashlib.sha1(reason.encode()).hexdigest()[:12]}"

        def again(e: dict[str, Any]) -> None:
            e.update({"count": int(e.get("count", 1)) + 1, "lastTimestamp": iso(now), "message": message})
        if self.store.peek("events", ns, ev_name) is not None:
            self.store.mutate("events", ns, ev_name, again)
            return
        self.store.create("events", ns, {
            "metadata": {"name": ev_name, "namespace": ns},
            "involvedObject": {"kind": "Job", "namespace": ns, "name": name, "uid": job["metadata"]["uid"],
                               "apiVersion": "batch/v1"},
            "reason": reason, "message": message, "type": "Warning", "source": {"component": "job-controller"},
            "reportingComponent": "job-controller", "firstTimestamp": iso(now), "lastTimestamp": iso(now),
            "count": 1})
