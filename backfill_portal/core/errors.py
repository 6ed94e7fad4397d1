"""Application errors. Services raise these; the API and the views map them to
HTTP codes in one place (core.api.exception_handler, core.web helpers)."""
from __future__ import annotations


class ApplicationError(Exception):
    """A refusal the user should see, with an HTTP status and optional field messages."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.message = message
        self.fields: dict[str, list[str]] = dict(fields or {})
        if field:
            self.fields.setdefault(field, []).append(message)

    def as_dict(self) -> dict:
        body: dict = {"detail": self.message, "code": self.code}
        if self.fields:
            body["errors"] = self.fields
        return body


class ValidationError(ApplicationError):
    status_code = 400
    code = "invalid"


class PermissionDenied(ApplicationError):
    status_code = 403
    code = "permission_denied"


class NotFound(ApplicationError):
    status_code = 404
    code = "not_found"


class ConflictError(ApplicationError):
    """A lost race or an illegal state transition: retrying the same call will not help."""

    status_code = 409
    code = "conflict"


class Unavailable(Exception):
    """A database or service the portal needs refused the connection or is down; the
    message says which. Not an ApplicationError: the caller may retry later."""
