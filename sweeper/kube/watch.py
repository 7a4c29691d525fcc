"""A watch request's events as a stream: `WatchStream` reads them line by line until the server
ends it (or `close()` from another thread does); a 410 is `Expired`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import urllib3

from sweeper.errors import Transient
from sweeper.kube.retry import _truncate


class Expired(Transient):
    """A watch's resourceVersion is older than the history the apiserver keeps (410 Gone): list
    again, then watch from the list's resourceVersion."""


class WatchStream:
    """The events of one watch request, as (type, object) pairs, until the server ends the
    stream. `close()` from another thread ends it early."""

    def __init__(self, what: str, resp: Any, silence: float | None = None) -> None:
        self.what = what
        self._resp = resp
        self.silence = silence  # the client's read timeout: the longest wait for the next bytes

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buf = b""
        ended = False
        try:
            for chunk in self._resp.stream(amt=None, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield self._event(line)
            ended = True
        except urllib3.exceptions.ReadTimeoutError as exc:
            within = f" in {self.silence:g} s" if self.silence else ""
            raise Transient(f"{self.what}: the watch went silent: no event and no end of the stream{within}") \
                from exc
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, OSError, AttributeError,
                ValueError) as exc:  # the last two: a response closed under the read by close()
            raise Transient(f"{self.what}: the watch was cut: {exc.__class__.__name__}: {_truncate(str(exc))}") \
                from exc
        finally:
            if ended:
                self._resp.release_conn()  # read to its end: the connection may carry the next request
            else:
                self.close()
        if buf.strip():
            yield self._event(buf)

    def _event(self, line: bytes) -> tuple[str, dict[str, Any]]:
        try:
            ev = json.loads(line)
            type_, obj = str(ev["type"]), ev["object"]
        except (ValueError, KeyError, TypeError) as exc:
            raise Transient(f"{self.what}: an unreadable watch event: {_truncate(line.decode(errors='replace'))}") \
                from exc
        if type_ == "ERROR":
            code, message = int(obj.get("code") or 0), str(obj.get("message") or "")
            if code == 410:
                raise Expired(f"{self.what}: 410 {obj.get('reason', 'Expired')}: {_truncate(message)}", 410,
                              str(obj.get("reason") or "Expired"))
            raise Transient(f"{self.what}: watch error {code}: {_truncate(message)}", code, str(obj.get("reason") or ""))
        return type_, obj

    def close(self) -> None:
        """End the stream, from any thread; its connection is closed, never reused mid-body."""
        try:
            shutdown = getattr(self._resp, "shutdown", None)
            if shutdown is not None:
                shutdown()  # wakes a read blocked on the socket in another thread
            self._resp.close()
            self._resp.release_conn()
        except Exception:  # noqa: BLE001 - closing a stream that is already gone
            pass
