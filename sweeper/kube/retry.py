"""How one call fails and when it is tried again: the `KubeError` an API error becomes
(`translate`, with the Status message and a bounded payload), the one a request that got no
answer becomes (`unanswered`: a TLS failure, a timeout, a dropped connection), and the backoff
and the request timeouts (`RetryPolicy`)."""

from __future__ import annotations

import json
import random
import ssl
from dataclasses import dataclass

import urllib3
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
# Seconds to open a connection (TCP and TLS), as client-go's TLS handshake timeout
# (k8s.io/apimachinery/pkg/util/net/http.go, SetTransportDefaults: TLSHandshakeTimeout 10 s).
CONNECT_TIMEOUT = 10.0
# Seconds a request may wait on a silent apiserver: a little longer than the apiserver's own limit
# on a request that is not a watch (kube-apiserver --request-timeout, 1m0s by default;
# https://kubernetes.io/docs/reference/command-line-tools-reference/kube-apiserver/), after which
# it answers 504 itself, so an answer that is still coming is never cut off.
READ_TIMEOUT = 70.0


class TimedOut(Transient):
    """The apiserver did not answer (or accept the connection) within the request timeout."""


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff with full jitter; Retry-After wins on 429; only transient errors are retried. Each
    request connects within `connect_timeout` (at most `read_timeout`) and then waits at most
    `read_timeout` for each read of its answer; a call that timed out `timeout_attempts` times is
    not tried again (a silent apiserver costs minutes, not the whole `attempts`)."""

    attempts: int = 6
    base: float = 0.5
    cap: float = 20.0
    connect_timeout: float = CONNECT_TIMEOUT
    read_timeout: float = READ_TIMEOUT
    timeout_attempts: int = 2

    @property
    def request_timeout(self) -> tuple[float, float]:
        """(connect, read), as the client's `_request_timeout` takes them."""
        return min(self.connect_timeout, self.read_timeout), self.read_timeout

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


def unanswered(exc: BaseException, what: str, server: str, timeout: tuple[float, float],
               setting: str = "") -> KubeError:
    """A request that got no answer, as one of ours. A TLS failure (an unknown CA, a certificate for
    another name, https:// to a plain-HTTP server) is not retried: it does not mend itself. A TLS
    connection closed under the request, a timeout, a refused or dropped connection are transient.
    `timeout`: the request's (connect, read); `setting`: where its read timeout comes from."""
    tls = tls_failure(exc)
    if tls is not None and not isinstance(tls, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)):
        return KubeError(f"{what}: TLS with the apiserver at {server} failed: {_truncate(str(tls))}; check the "
                         "kubeconfig's certificate-authority (the cluster's CA?), its server URL (https:// for an "
                         "apiserver that speaks TLS, http:// for one that does not) and any proxy in between",
                         None, "TLSError")
    if tls is not None:
        return Transient(f"{what}: the TLS connection to {server} was closed: {_truncate(str(tls))}")
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return TimedOut(f"{what}: the apiserver at {server} did not answer within {timeout[1]:g} s"
                        + (f" ({setting})" if setting else ""), None, "Timeout")
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError) \
            and not isinstance(exc, urllib3.exceptions.NewConnectionError):  # a subclass, for a refused one
        return TimedOut(f"{what}: no connection to the apiserver at {server} within {timeout[0]:g} s",
                        None, "Timeout")
    return Transient(f"{what}: connection failed: {exc.__class__.__name__}: {_truncate(str(exc))}")


def tls_failure(exc: BaseException) -> BaseException | None:
    """The TLS error behind `exc`, in its own words (Python's ssl error where there is one, else
    urllib3's), or None. The client turns urllib3's SSLError into an ApiException with no body, and
    then fails on that body itself (AttributeError: 'NoneType' object has no attribute 'decode', in
    kubernetes/client/api_client.py), so the chain of causes is followed, `reason` included."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    found: BaseException | None = None
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLError):
            return e
        if isinstance(e, urllib3.exceptions.SSLError) and found is None:
            found = e
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *(a for a in e.args
                                                                          if isinstance(a, BaseException))]
    return found
