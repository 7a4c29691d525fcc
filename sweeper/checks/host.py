"""What the node-local checks read besides NVML: sysfs files, commands, the environment.

`RealHost` reads the machine the check runs on (under a root, so a check Job can mount the
host's /sys elsewhere); `checks.fake.FakeHost` answers from a table for tests and the
simulated kubelet. Missing is not the same as unreadable: `read` returns None for a file that
does not exist and raises OSError for one that cannot be read. The host's own programs (the EFA
installer's fi_info, journalctl over the host's journal) run as `chroot ROOT PROG ...` through
`run`, with the host's libraries; FakeHost answers those from its `host_commands`."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Protocol


class Host(Protocol):
    def read(self, path: str) -> str | None: ...

    def listdir(self, path: str) -> list[str] | None: ...

    def exists(self, path: str) -> bool: ...

    def resolve(self, path: str) -> str:
        """The path as the check process can open or run it."""
        ...

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); raises FileNotFoundError when the program is missing.
        `env` adds to the environment."""
        ...

    def env(self) -> dict[str, str]: ...

    def machine(self) -> str: ...


class RealHost:
    def __init__(self, root: str = "/") -> None:
        self.root = Path(root)

    def _p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str | None:
        try:
            return self._p(path).read_text(errors="replace")
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self._p(path)))
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return self._p(path).exists()

    def resolve(self, path: str) -> str:
        return str(self._p(path))

    def run(self, argv: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        if argv[:2] == ["chroot", "/"] and len(argv) > 2:
            argv = argv[2:]  # on the host itself: a chroot to / changes nothing and needs no CAP_SYS_CHROOT
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                                  env={**os.environ, **env} if env else None)
        except subprocess.TimeoutExpired as exc:
            return 124, str(exc.stdout or ""), f"timed out after {timeout:g}s"
        return proc.returncode, proc.stdout, proc.stderr

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def machine(self) -> str:
        return platform.machine()
