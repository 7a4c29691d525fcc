"""Notifications: a Slack-compatible JSON webhook on holds and replacements, retried with
backoff. A notification that cannot be delivered is logged, never fatal to the sweep."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from sweeper.output import clean, clean_lines


def mrkdwn(text: str) -> str:
    """Text for a Slack `mrkdwn` field: `&`, `<` and `>` escaped, so that a kernel-log line or a node
    name cannot make a link or a mention (`<!channel>`); control and format characters shown."""
    return clean_lines(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def message(node: str, verdict: str, reasons: list[str], action: str, cluster: str = "") -> dict[str, Any]:
    """Slack's incoming-webhook shape: `text` for every client, `blocks` for a richer one. The
    text comes from the cluster (node names, check messages): escaped for mrkdwn, cut by
    characters before escaping so that no escape is cut in half."""
    head = clean(f"Sweeper: {node} {verdict}" + (f" in {cluster}" if cluster else "") + f" ({action})")
    why = "\n".join(f"• {clean(r[:300])}" for r in reasons[:5]) or "no reason recorded"
    return {"text": mrkdwn(f"{head}\n{why}"),
            "blocks": [{"type": "header", "text": {"type": "plain_text", "text": head[:150]}},
                       {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn(why[:2500])}}]}


class Webhook:
    def __init__(self, url: str, attempts: int = 4, sleep: Callable[[float], None] | None = None,
                 timeout: float = 10.0) -> None:
        import time

        self.url, self.attempts, self.timeout = url, max(1, attempts), timeout
        self.sleep = sleep or time.sleep
        self.sent = 0
        self.failed = 0

    def send(self, payload: dict[str, Any]) -> tuple[bool, str]:
        """(delivered, what happened). Retries 5xx, 429 and connection errors; not other 4xx."""
        body = json.dumps(payload).encode()
        last = ""
        for attempt in range(self.attempts):
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - the configured URL
                    resp.read()
                self.sent += 1
                return True, f"delivered on attempt {attempt + 1}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code < 500 and exc.code != 429:
                    break
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            if attempt + 1 < self.attempts:
                self.sleep(min(8.0, 0.5 * 2 ** attempt))
        self.failed += 1
        return False, f"not delivered: {last}"
