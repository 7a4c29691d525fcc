"""Pure functions from a tool's output to the common result document. Unreadable input is
an `error` result, never a pass."""
