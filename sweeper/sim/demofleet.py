"""The demo's fleet: sixteen p5.48xlarge nodes, three training jobs, and a fault on each of a
few nodes that the demo's sweeps find (sweeper.demo; `sweeper sim serve` without a fleet file)."""

from __future__ import annotations

from typing import Any

_NMA_XID79 = {"condition": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
              "message": "GPU has fallen off the bus"}
DEMO_FLEET: dict[str, Any] = {
    "name": "demo",
    "seed": 7,
    "speed": 600,
    "node_groups": [{"name_prefix": "gpu-p5-", "count": 16, "instance_type": "p5.48xlarge",
                     "zone": "us-east-1a", "labels": {"karpenter.sh/nodepool": "gpu"}, "age": "3d",
                     # the NodePool's startupTaints: each node Karpenter launches is gated until Sweeper passes it
                     "startup_taints": [{"key": "sweeper.dev/unvalidated", "effect": "NoSchedule"}], "boot": "3m"}],
    "workloads": [{"node": "gpu-p5-02", "gpus": 8, "duration": None},
                  {"node": "gpu-p5-06", "gpus": 8, "duration": "20h"},
                  {"node": "gpu-p5-11", "gpus": 4, "duration": "2d"}],
    "arrivals": {"per_hour": 0.15, "gpus": 8, "duration": ["2h", "8h"]},
    "faults": {
        # The EKS node monitoring agent's AcceleratedHardwareReady=False on two nodes: true on gpu-p5-04
        # (its GPU 3 fell off the bus), false on gpu-p5-10 (nothing in its kernel log): claims, tested.
        "gpu-p5-04": {"xids": [{"code": 79, "gpu": 3, "text": "GPU has fallen off the bus."}],
                      "outside_claims": [_NMA_XID79]},
        "gpu-p5-10": {"outside_claims": [_NMA_XID79]},
        "gpu-p5-09": {"missing_gpus": 1},
        "gpu-p5-13": {"hung_check": True},
        "gpu-p5-14": {"remap_pending": [5]},
        # Busy until its job ends at 20h, watched meanwhile by light checks: corrected ECC errors on
        # GPU 2 climb far faster than the trend rule allows, and would turn uncorrectable on day 3.
        "gpu-p5-06": {"ecc_growth": {2: 240}, "ecc_fail_at": "3d"},
        # Its EFA links carry 40% of their rate: every single-node check passes; only a pair sweep
        # across the fabric, and re-pairing with known-good partners, finds it.
        "gpu-p5-08": {"link_degraded": 0.4},
    },
}
