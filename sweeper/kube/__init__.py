"""The Kubernetes API, behind one module: the only importer of the `kubernetes` client.

Objects cross this boundary as plain dicts (the API's JSON), read without the client's
model classes, which is several times faster on lists of tens of thousands of pods.
Errors become the `KubeError` family; one retry policy covers every call.

The package: `adapter` (the connection and the one retry loop), `retry` (errors, backoff and timeouts),
`watch` (a watch's event stream), and the calls by resource: `nodes` (nodes, NodeClaims, pods),
`workloads` (Jobs, Services, MPIJobs, watches), `records` (Leases, ConfigMaps, Events) and `dra`
(DRA's ResourceSlices and ResourceClaims, Kueue's Workloads, folded into the node and pod lists).
"""

from __future__ import annotations

from sweeper.kube import imports  # noqa: F401  first: the client without what Sweeper never uses
from sweeper.kube.nodes import NodeCalls, slim_pod
from sweeper.kube.records import RecordCalls
from sweeper.kube.retry import JSON_PATCH, MERGE_PATCH, MPIJOB, UNSERVED, RetryPolicy, TimedOut, translate
from sweeper.kube.watch import Expired, WatchStream
from sweeper.kube.workloads import WorkloadCalls

__all__ = ["JSON_PATCH", "MERGE_PATCH", "MPIJOB", "UNSERVED", "Expired", "Kube", "RetryPolicy", "TimedOut",
           "WatchStream", "slim_pod", "translate"]


class Kube(NodeCalls, WorkloadCalls, RecordCalls):
    """The calls Sweeper makes, each retried under one policy and counted.

    `fence`, when set, is called before every attempt of a write (except the Lease's own): a
    sweep sets it, on its own view of the adapter (`fenced`), to the lock's check, so that a
    run that no longer holds the sweep lock stops writing at once."""
