"""What a node has is read from the node: the fabric NICs a check expects and a pair requests come
from what the node advertises before the instance type's figure."""

from __future__ import annotations

import json

from sweeper.profiles import Profile, advertised_nics

P5 = Profile("p5.48xlarge", gpus=8, nic="efa", nics=32, fabric_resources={"vpc.amazonaws.com/efa": 32},
             nccl_pair_busbw_min=350.0)
ND = Profile("nd", gpus=8, nic="ib", nics=8, fabric_resources={"rdma/ib": 1})
A3 = Profile("a3", gpus=8, nic="gve", nics=4)
KARPENTER = {"karpenter.sh/nodepool": "gpu"}


def test_efa_the_device_plugins_count_comes_first() -> None:
    """AWS's EFA device plugin advertises one `vpc.amazonaws.com/efa` per EFA device, and Karpenter
    attaches EFA interfaces only for a pod that requests them
    (https://docs.aws.amazon.com/eks/latest/userguide/device-management-efa.html)."""
    assert advertised_nics("efa", {"vpc.amazonaws.com/efa": 16}, {}, {}) == 16
    assert advertised_nics("efa", {"vpc.amazonaws.com/efa": 0}, {}, {}) == 0
    assert advertised_nics("efa", {}, KARPENTER, {}) == 0, "a Karpenter node that advertises no EFA has none"
    assert advertised_nics("efa", {}, {}, {}) is None, "no device plugin on a node group: the instance type's figure"
    none = P5.on_node({"vpc.amazonaws.com/efa": 0}, KARPENTER, {})
    assert none.nics == 0 and none.fabric_resources == {} and "--expect-nics" in none.check_args()
    assert none.check_args()[none.check_args().index("--expect-nics") + 1] == "0"
    assert P5.on_node({"vpc.amazonaws.com/efa": 8}, {}, {}).fabric_resources == {"vpc.amazonaws.com/efa": 8}
    assert P5.on_node({}, {}, {}) is P5


def test_rdma_shared_plugin_counts_are_not_nic_counts() -> None:
    """The RDMA shared device plugin advertises `rdmaHcaMax` (how many pods may share the HCAs,
    1000 by default), not the HCAs (github.com/Mellanox/k8s-rdma-shared-dev-plugin, README): only 0
    says something, that no HCA is there."""
    assert advertised_nics("ib", {"rdma/ib": 1000}, {}, {}) is None
    assert advertised_nics("ib", {"rdma/ib": 0}, {}, {}) == 0
    assert ND.on_node({"rdma/ib": 0}, {}, {}).fabric_resources == {}


def test_gke_gvnics_are_the_nodes_additional_networks() -> None:
    """An A3's GPU gVNICs exist only with multi-networking
    (https://cloud.google.com/kubernetes-engine/docs/how-to/gpu-bandwidth-gpudirect-tcpx; without
    multi-networking a node has its one primary interface:
    https://cloud.google.com/kubernetes-engine/docs/how-to/setup-multinetwork-support-for-pods); GKE names
    a node's networks as `networking.gke.io.networks/<name>` (and `<name>.IP`) resources and lists
    its additional interfaces in the networking.gke.io/north-interfaces annotation."""
    north = {"networking.gke.io/north-interfaces": json.dumps([{"network": f"vpc{k}", "ipAddress": "10.0.0.1"}
                                                                for k in range(1, 5)])}
    assert advertised_nics("gve", {}, {}, north) == 4
    assert advertised_nics("gve", {"networking.gke.io.networks/vpc1": 1, "networking.gke.io.networks/vpc1.IP": 1,
                                   "networking.gke.io.networks/vpc2": 1}, {}, {}) == 2
    assert advertised_nics("gve", {}, {}, {}) == 0
    assert advertised_nics("gve", {}, {}, {"networking.gke.io/north-interfaces": "not json"}) == 0
    assert advertised_nics("gve", {}, {}, {"networking.gke.io/north-interfaces": "5"}) == 0
    assert A3.on_node({}, {}, {}).nics == 0


def test_a_pair_requests_what_both_nodes_advertise_and_has_a_floor_only_on_the_fabric() -> None:
    """NCCL reaches EFA only through the devices its pod was given; without them it runs on TCP
    sockets, about 4 GB/s where an H100 pair on its fabric shows about 340 (NVIDIA AI Cluster Runtime,
    https://docs.nvidia.com/aicr/latest/integrator-guide/gke-tcpxo-networking.md). A floor is a figure
    of the fabric: no fabric device requested, no floor; a floor the playbook gives is taken as given."""
    from sweeper.actions import ActionContext
    from sweeper.actions.pair import pair_fabric, pair_floor

    def node(p: Profile) -> dict[str, object]:
        return {"name": p.name, "profile": p.as_vars()}

    with_efa, without = node(P5), node(P5.on_node({"vpc.amazonaws.com/efa": 0}, KARPENTER, {}))
    assert pair_fabric(with_efa, with_efa) == {"vpc.amazonaws.com/efa": 32}
    assert pair_fabric(with_efa, without) == {} == pair_fabric(without, with_efa)
    assert pair_fabric(with_efa, node(P5.on_node({"vpc.amazonaws.com/efa": 16}, {}, {}))) == {
        "vpc.amazonaws.com/efa": 16}
    assert pair_floor(ActionContext(node=with_efa, partner=with_efa), {}) == (350.0, "")
    floor, why = pair_floor(ActionContext(node=with_efa, partner=without), {})
    assert floor is None and "requests no fabric device" in why
    assert pair_floor(ActionContext(node=with_efa, partner=without), {"min_busbw": 3}) == (3.0, "")
    assert pair_floor(ActionContext(node=node(A3), partner=node(A3)), {})[0] is None
