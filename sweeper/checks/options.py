"""The options of `sweeper check`, declared once: the CLI builds its flags from this table and
the simulated kubelet reads a check pod's arguments with it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class CheckOptions:
    node: str = ""
    expect_gpus: int = 8
    gpu_model: str = ""
    kernel_log: str = ""
    xid_window: float = 86400.0

    @classmethod
    def from_argv(cls, argv: list[str]) -> CheckOptions:
        parser = argparse.ArgumentParser(prog="sweeper check", add_help=False, exit_on_error=False,
                                         allow_abbrev=False)
        for name, _type, _default, _help in OPTIONS:
            parser.add_argument("--" + name.replace("_", "-"), dest=name, type=_type, default=_default)
        parser.add_argument("--json", action="store_true")
        ns, _unknown = parser.parse_known_args(argv)
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls)})


OPTIONS: list[tuple[str, type, object, str]] = [
    ("node", str, "", "name of the node being checked (default: $NODE_NAME)"),
    ("expect_gpus", int, 8, "number of GPUs the node's profile expects"),
    ("gpu_model", str, "", "substring the GPU model name must contain (empty: any)"),
    ("kernel_log", str, "", "file with the kernel log (default: read `dmesg`)"),
    ("xid_window", float, 86400.0, "seconds of kernel log to consider for XIDs"),
]
