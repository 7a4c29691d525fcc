"""How one call fails and when it is tried again: the `KubeError` an API error becomes
(`translate`, with the Status message and a bounded payload) and the backoff (`RetryPolicy`)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from sweeper.errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    NotServed,
    Transient,
)

# The apiserver's 404 for a path it does not serve (a custom resource whose CRD is not installed);
# a missing object's 404 names it in `details` instead.
# https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris
UNSERVED = "the server could not find the requested resource"
# The MPI Operator's MPIJob: https://github.com/kubeflow/mpi-operator (pkg/apis/kubeflow/v2beta1)
MPIJOB = ("kubeflow.org", "v2beta1", "mpijobs")
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff with full jitter; Retry-After wins on 429; only transient errors are retried."""

    attempts: int = 6
    base: float = 0.5
    cap: float = 20.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(self.cap, retry_after)
        return rng.uniform(0, min(self.cap, self.base * 2 ** attempt))


def _truncate(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[:n] + "..."


def translate(exc: ApiException, what: str) -> KubeError:
    """An ApiException as one of ours, with the Status message and a bounded payload."""
    status = exc.status or 0
    reason, message, named = exc.reason or "", "", True
    try:
        body = json.loads(exc.body or "{}")
        message = body.get("message", "")
        reason = body.get("reason", reason)
        named = bool((body.get("details") or {}).get("name"))
    except (ValueError, TypeError, AttributeError):
        message = _truncate(str(exc.body or ""))
    text = f"{what}: {status} {reason}: {_truncate(message)}"
    if status == 404 and not named and message == UNSERVED:
        return NotServed(text, status, reason)
    if status == 404:
        return NotFound(text, status, reason)
    if status == 409:
        return (AlreadyExists if reason == "AlreadyExists" else Conflict)(text, status, reason)
    if status == 422 and "Testing value" in message:
        return Conflict(text, status, "TestFailed")  # a JSON patch `test` on resourceVersion failed
    if status == 422:
        return Invalid(text, status, reason)
    if status in (401, 403):
        return Forbidden(text, status, reason)
    if status == 429 or status >= 500:
        err = Transient(text, status, reason)
        ra = (exc.headers or {}).get("Retry-After") if exc.headers else None
        err.retry_after = float(ra) if ra and str(ra).isdigit() else None  # type: ignore[attr-defined]
        return err
    return KubeError(text, status, reason)

