"""The connection and the one retry loop every call goes through (`_Adapter._call`), with
paging, counting and the fence on writes; `Kube` adds the calls themselves, by resource."""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Self

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import incluster_config
from kubernetes.config.config_exception import ConfigException

from sweeper.clock import Clock, WallClock
from sweeper.errors import ConfigError, NotFound, Transient
from sweeper.kube.retry import RetryPolicy, _truncate, translate


@dataclass
class _Tally:
    requests: int = 0
    errors: int = 0


class _Adapter:
    """One connection to the apiserver under one retry policy, with its request counters. The
    calls live in the resource modules (nodes, workloads, records), each a base of `Kube`."""

    def __init__(self, api_client: client.ApiClient, clock: Clock | None = None,
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
        return cls(client.ApiClient(cfg), clock=clock)

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

    def _call(self, what: str, fn: Callable[[], Any], *, raw: bool = True, attempts: int | None = None,
              write: bool = False) -> Any:
        limit = attempts or self.retry.attempts
        attempt = 0
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
            except ApiException as exc:
                err = translate(exc, what)
            except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
                err = Transient(f"{what}: connection failed: {exc.__class__.__name__}: {_truncate(str(exc))}")
                err.retry_after = None  # type: ignore[attr-defined]
            self._tally.errors += 1
            if not isinstance(err, Transient) or attempt + 1 >= limit:
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
