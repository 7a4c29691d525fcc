"""benchmarks.requests_per_node counts each request as a node's own or the run's: the run-wide
lists that discovery and pending demand added with DRA and Kueue (ResourceSlices, ResourceClaims,
Workloads) are the run's, not each node's; a list of one node's ResourceSlices (the field
selector `spec.nodeName`, https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/)
is that node's."""

from __future__ import annotations

from benchmarks.requests_per_node import kind, shared


def test_run_wide_dra_and_kueue_lists_are_shared() -> None:
    for path in ("/apis/resource.k8s.io/v1/resourceslices?limit=500",
                 "/apis/resource.k8s.io/v1/resourceclaims?limit=500",
                 "/apis/kueue.x-k8s.io/v1beta1/workloads?limit=500"):
        assert shared(kind("GET", path)), path


def test_one_nodes_resource_slices_are_its_own() -> None:
    k = kind("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dgpu-1%2Cspec.driver%3Dgpu.nvidia.com")
    assert k == "LIST resourceslices (one node)"
    assert not shared(k)


def test_a_nodes_own_requests_are_not_shared() -> None:
    assert not shared(kind("GET", "/api/v1/namespaces/sweeper/pods?fieldSelector=spec.nodeName%3Dgpu-1"))
    assert not shared(kind("POST", "/apis/batch/v1/namespaces/sweeper/jobs"))
    assert shared(kind("GET", "/api/v1/nodes?limit=500"))
