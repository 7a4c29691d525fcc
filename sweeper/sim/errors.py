"""API errors as the apiserver returns them: an HTTP code and a Status body."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, *, kind: str = "", name: str = "",
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.kind = kind
        self.name = name
        self.retry_after = retry_after

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.kind or self.name:
            body["details"] = {"name": self.name, "kind": self.kind}
        if self.retry_after is not None:
            body.setdefault("details", {})["retryAfterSeconds"] = self.retry_after
        return body


def not_found(kind: str, name: str, group: str = "") -> ApiError:
    res = f"{kind}.{group}" if group else kind
    return ApiError(404, "NotFound", f'{res} "{name}" not found', kind=kind, name=name)


def already_exists(kind: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{kind} "{name}" already exists', kind=kind, name=name)


def conflict(kind: str, name: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {kind} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again", kind=kind, name=name)


def invalid(kind: str, name: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {message}', kind=kind, name=name)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)
