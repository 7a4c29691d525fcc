"""The connection and the one retry loop every call goes through (`_Adapter._call`), with
paging, counting and the fence on writes; `Kube` adds the calls themselves, by resource."""

from __future__ import annotations

import copy
import json
import os
import random
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Self

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config
from kubernetes.config.config_exception import ConfigException

from sweeper.clock import Clock, WallClock
from sweeper.errors import ConfigError, KubeError, NotFound, Transient
from sweeper.kube.retry import RetryPolicy, TimedOut, tls_failure, translate, unanswered


@dataclass
class _Tally:
    requests: int = 0
    errors: int = 0


class _Client(client.ApiClient):  # type: ignore[misc]
    """The client's ApiClient, with a request timeout on every call that does not name one (a
    watch names its own, a little longer than its timeoutSeconds): without one, a server that
    accepts the connection and never answers holds the call for ever."""

    request_timeout: tuple[float, float] = RetryPolicy().request_timeout

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = self.request_timeout
        return super().call_api(*args, **kwargs)


class _Adapter:
    """One connection to the apiserver under one retry policy, with its request counters. The
    calls live in the resource modules (nodes, workloads, records), each a base of `Kube`.
    `retry` also sets the request timeouts of every call (`RetryPolicy.request_timeout`)."""

    def __init__(self, api_client: _Client, clock: Clock | None = None,
                 retry: RetryPolicy | None = None, seed: int | None = None) -> None:
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.coord = client.CoordinationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.clock = clock or WallClock()
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._tally = _Tally()
        self.fence: Callable[[], None] | None = None

    @property
    def retry(self) -> RetryPolicy:
        return self._retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self._retry = policy
        self.api_client.request_timeout = policy.request_timeout

    @property
    def server(self) -> str:
        """The apiserver's URL, as the kubeconfig or the service account names it."""
        return str(self.api_client.configuration.host)

    @property
    def requests(self) -> int:
        return self._tally.requests

    @property
    def errors(self) -> int:
        return self._tally.errors

    def fenced(self, fence: Callable[[], None]) -> Self:
        """A view of this adapter (same connection, same counters) whose writes call `fence` first."""
        view = copy.copy(self)
        view.fence = fence
        return view

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                    clock: Clock | None = None) -> Self:
        cfg = client.Configuration()
        try:
            if kubeconfig or not _in_cluster():
                config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
            else:
                # The service account's token and CA, where the pod has them mounted (overridable for a
                # pod that mounts them elsewhere).
                sa = os.environ.get("SWEEPER_SERVICEACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
                incluster_config.InClusterConfigLoader(token_filename=f"{sa}/token",
                                                       cert_filename=f"{sa}/ca.crt").load_and_set(cfg)
        except (ConfigException, OSError, TypeError) as exc:
            raise ConfigError(f"cannot load the Kubernetes configuration: {exc}") from exc
        cfg.retries = False  # our policy retries, not urllib3's
        cfg.connection_pool_maxsize = 64  # nodes are swept in parallel
        return cls(_Client(cfg), clock=clock)

    def close(self) -> None:
        self.api_client.close()

    # -- the one retry loop ------------------------------------------------------
    def _delete(self, what: str, fn: Callable[[], Any]) -> bool:
        """One DELETE (a write, retried as writes are): True when it deleted, False when the object
        was already gone (404)."""
        try:
            self._call(what, fn, write=True)
        except NotFound:
            return False
        return True

    def _unanswered(self, exc: BaseException, what: str, timeout: tuple[float, float] | None = None) -> KubeError:
        """`exc`, raised by a request that got no answer, as one of ours; `timeout`: the one the request
        named, where not the policy's (a watch's)."""
        if timeout is None:
            return unanswered(exc, what, self.server, self.retry.request_timeout, "the config's api_timeout")
        return unanswered(exc, what, self.server, timeout)

    def _call(self, what: str, fn: Callable[[], Any], *, raw: bool = True, attempts: int | None = None,
              write: bool = False, timeout: tuple[float, float] | None = None) -> Any:
        """`fn` under the retry policy. `timeout`: the (connect, read) timeout `fn` passes the client
        itself, where not the policy's (said in the error when it runs out)."""
        limit = attempts or self.retry.attempts
        attempt = timeouts = 0
        while True:
            if write and self.fence is not None:
                self.fence()  # LockLost: this run no longer holds the sweep lock
            self._tally.requests += 1
            try:
                resp = fn()
                if not raw:
                    return resp
                data = resp.data
                return json.loads(data) if data else {}
            except ApiException as exc:  # status 0: no answer (the client's own wrapping of a TLS failure)
                err = translate(exc, what) if exc.status or tls_failure(exc) is None \
                    else self._unanswered(exc, what, timeout)
            except AttributeError as exc:  # the client's handler of a TLS failure trips on the body it lacks
                if tls_failure(exc) is None:
                    raise
                err = self._unanswered(exc, what, timeout)
            except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, ssl.SSLError) as exc:
                err = self._unanswered(exc, what, timeout)
            self._tally.errors += 1
            timeouts += isinstance(err, TimedOut)
            if not isinstance(err, Transient) or attempt + 1 >= limit or timeouts >= self.retry.timeout_attempts:
                raise err
            self.clock.sleep(self.retry.delay(attempt, getattr(err, "retry_after", None), self._rng))
            attempt += 1

    def _pages(self, what: str, fn: Callable[..., Any], page_size: int,
               keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None, **kw: Any) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            def fetch(t: str | None = token) -> Any:
                return fn(limit=page_size, _continue=t, _preload_content=False, **kw)
            page = self._call(what, fetch)
            items = page.get("items") or []
            yield from (map(keep, items) if keep else items)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")
