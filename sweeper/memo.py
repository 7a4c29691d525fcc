"""A bounded memo of pure results, shared by the layers that remember work done for the same input
(a checked render, a rendered text's parse, a playbook's parse)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class Recent:
    """A bounded memo of pure results (least recently used first out), safe across threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.done: OrderedDict[Any, Any] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Any) -> Any:
        """The value kept for `key`, or None."""
        with self.lock:
            value = self.done.get(key)
            if value is not None:
                self.done.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.done[key] = value
            self.done.move_to_end(key)
            while len(self.done) > self.size:
                self.done.popitem(last=False)
