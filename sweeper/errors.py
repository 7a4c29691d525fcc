"""One exception tree for the whole project; the CLI maps each branch to an exit code."""

from __future__ import annotations


class SweeperError(Exception):
    """Base of every error Sweeper raises on purpose."""

    exit_code = 1


class ConfigError(SweeperError, ValueError):
    """Bad configuration, arguments or input files."""

    exit_code = 2


class PlaybookError(SweeperError, ValueError):
    """A playbook or template that cannot be loaded or rendered."""

    exit_code = 2


class StateError(SweeperError):
    """The history database cannot be opened or is of an unknown schema."""

    exit_code = 3


class CheckError(SweeperError):
    """A node-local check could not run at all."""

    exit_code = 1


class LockHeld(SweeperError):
    """Another sweeper holds the sweep lock."""

    exit_code = 4

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


class ToolErrors(SweeperError):
    """The run stopped: the same fault of the check itself (its image, its spec, admission) repeated
    on several nodes. Nothing is known about those nodes; fix the check, then sweep again."""

    exit_code = 5


class Interrupted(SweeperError):
    """Ctrl-C (SIGINT) stopped the command. A sweep stops as on SIGTERM, hands back what it held and
    reports; the exit code says it did not end on its own: 130, as a shell reports such a stop."""

    exit_code = 130


class LockLost(SweeperError):
    """The sweep lock is no longer this run's (another sweeper took it, or it could not be renewed
    in time): the run stopped writing to the cluster and the history at once."""

    exit_code = 4


class KubeError(SweeperError):
    """The Kubernetes API answered with an error or could not be reached."""

    exit_code = 3

    def __init__(self, message: str, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(KubeError):
    pass


class NotServed(NotFound):
    """The API server does not serve the resource at all (404 on its path, no object named): a
    custom resource whose CRD is not installed, as opposed to one object that is not found."""


class Conflict(KubeError):
    pass


class AlreadyExists(Conflict):
    pass


class Forbidden(KubeError):
    pass


class Invalid(KubeError):
    pass


class Transient(KubeError):
    """429, 5xx, timeouts and dropped connections: worth a retry."""
