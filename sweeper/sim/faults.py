"""A simulated node's faults, as the fleet file names them under a node or node group's `faults`
(each key declared once, checked by the loader; docs/simulator.md lists them)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict

from sweeper.schema import duration_type, model_of, setting
from sweeper.sim.claims import OutsideClaim


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_Gpu = Annotated[int, Strict(), Field(ge=0)]
_At = duration_type(ge=0)


class _Xid(_Strict):
    code: Annotated[int, Strict(), Field(ge=1)]
    gpu: _Gpu = 0
    at: _At = 0.0  # type: ignore[valid-type]
    text: Annotated[str, Strict()] = ""


class _Sxid(_Strict):
    code: Annotated[int, Strict(), Field(ge=1)]
    switch: _Gpu = 0
    fatal: Annotated[bool, Strict()] = False
    at: _At = 0.0  # type: ignore[valid-type]


class _Storm(_Strict):
    code: Annotated[int, Strict(), Field(ge=1)]
    gpu: _Gpu = 0
    count: Annotated[int, Strict(), Field(ge=1)] = 1000
    at: _At = 0.0  # type: ignore[valid-type]


@dataclass
class Faults:
    """A node's faults as the fleet file names them (each key declared once, checked by the loader)."""

    xids: list[dict[str, Any]] = setting(help="{code, gpu, at: after start, text}", factory=list,
                                         annotation=list[_Xid], allowed="list of {code, gpu, at, text}")
    missing_gpus: int = setting(0, ge=0)
    hung_check: bool = setting(False)
    garbage_output: bool = setting(False)
    check_crash: bool = setting(False)
    ecc_dbe: dict[int, int] = setting(factory=dict, ge=0)
    remap_pending: list[int] = setting(factory=list, ge=0)
    remap_failure: list[int] = setting(factory=list, ge=0)
    pod_lands_on_taint: int = setting(0, "times a GPU pod is bound just as Sweeper's taint lands", ge=0)
    not_ready: bool = setting(False)
    pcie_replay: list[int] = setting(help="GPUs whose PCIe link replays too often", factory=list, ge=0)
    nvlink_down: list[int] = setting(help="GPUs with an NVLink link down", factory=list, ge=0)
    low_bandwidth: float = setting(1.0, "NCCL bus bandwidth as a share of the healthy figure", ge=0, le=1)
    dcgm_runtime_error: bool = setting(False, "dcgmi cannot run at all")
    checks_never_schedule: bool = setting(False, "the scheduler never binds Sweeper's check pods here")
    lose_check_pod: int = setting(0, "times the kubelet loses a running check pod (it vanishes)", ge=0)
    ecc_growth: dict[int, float] = setting(help="GPU -> corrected ECC errors per simulated day", factory=dict, ge=0)
    ecc_fail_at: float | None = setting(None, "when the growing GPUs start reporting uncorrectable errors",
                                        duration=True, ge=0)
    remap_growth: dict[int, float] = setting(help="GPU -> remapped rows per simulated day", factory=dict, ge=0)
    pcie_downtrained: list[int] = setting(help="GPUs whose link trained at x8", factory=list, ge=0)
    nic_port_down: list[int] = setting(help="fabric devices (by index) whose port is down", factory=list, ge=0)
    nics_missing: int = setting(0, ge=0)
    mtu: int = setting(0, "the ENA/primary interface MTU (0: the healthy 9001)", ge=0, le=65535)
    poor_affinity: bool = setting(False, "every NIC across the CPU socket from every GPU")
    xid_storm: dict[str, Any] = setting(help="{code, gpu, count, at}", factory=dict, annotation=_Storm | None,
                                        allowed="{code, gpu, count, at}",
                                        convert=lambda v: v.model_dump() if v else {})
    sxids: list[dict[str, Any]] = setting(help="NVSwitch errors", factory=list, annotation=list[_Sxid],
                                          allowed="list of {code, switch, fatal, at}")
    thermal: list[int] = setting(help="GPUs past their thermal limit", factory=list, ge=0)
    throttle: list[int] = setting(help="GPUs held down by HW slowdown", factory=list, ge=0)
    recovery_action: dict[int, int] = setting(help="GPU -> NVML recovery action", factory=dict, ge=0)
    gpu_lost: list[int] = setting(factory=list, ge=0)
    persistence_off: bool = setting(False)
    dcgm_fail: dict[int, str] = setting(help="GPU -> DCGM test that fails on it", factory=dict)
    ring_buffer_span: float | None = setting(None, "the kernel ring buffer holds only the newest this long of the "
                                             "log (a noisy driver overwrote the rest); the journal keeps it all",
                                             duration=True, gt=0)
    no_peermem: bool = setting(False, "no GPUDirect RDMA peer-memory module is loaded")
    fabric_manager_down: bool = setting(False, "Fabric Manager is not running: NVSwitch GPUs never join the fabric")
    no_journal: bool = setting(False, "the host keeps no journal files (journald's Storage=none)")
    journal_newer: bool = setting(False, "the host's journald writes a journal format newer than the check "
                                  "image's journalctl reads")
    link_degraded: float = setting(1.0, "share of the node's fabric rate left (a pair runs at the slower node's)",
                                   ge=0, le=1)
    port_flapping: bool = setting(False, "a fabric port drops now and then: pair bandwidth varies widely and some "
                                  "pair runs abort with a NET/OFI or NET/IB error")
    path_mtu: dict[str, int] = setting(help="interface -> the largest packet a path through this node carries "
                                       "(larger don't-fragment probes are lost)", factory=dict, ge=68)
    gpudirect_off: bool = setting(False, "NCCL falls back to host memory (no GPUDirect RDMA): about a quarter of "
                                  "the pair bandwidth")
    fabric_corrupt: bool = setting(False, "the fabric corrupts data: a pair's all-reduce counts wrong values")
    runtime_error: str = setting("", "the NVIDIA container stack's words when it cannot start a container that "
                                 "asks for GPUs (e.g. \"nvidia-container-cli: initialization error: nvml error: "
                                 "driver/library version mismatch: unknown\"): every such container on the node "
                                 "fails to start, StartError with exit 128, as containerd reports it")
    forged_evidence: str = setting("", "the node's evidence pod prints this forgery instead of its bundle (a hostile "
                                   "node writes its own log)", choices=("", "longname-bomb", "pax-bomb"))
    forged_output: str = setting("", "what the node's check, dcgmi, all_reduce_perf and pair-allreduce (its rank's "
                                 "whole log) print instead (a hostile node)")
    forged_exit: int = setting(0, "the exit code the node's forged program ends with", ge=0, le=255)
    forged_summary: str = setting("", "what the node's check writes as its termination message (a hostile node)")
    outside_claims: list[dict[str, Any]] = setting(help="other tools' claims of the node: conditions, taints, DRA "
                                                   "device taints (sweeper.sim.claims)", factory=list,
                                                   annotation=list[OutsideClaim], allowed="list of OutsideClaim")


FAULT_KEYS = {f.name for f in fields(Faults)}
_FAULTS = model_of(Faults, "FaultsFile")
