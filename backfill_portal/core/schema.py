"""The OpenAPI schema's view of refusals: every operation documents the error answers
it can give, with the one error body `core.api.exception_handler` writes.

Declared once here rather than with `extend_schema` on each view, so a new view cannot
forget them:

* 400 everywhere: a malformed parameter or body, a NUL byte in the path, query or a header;
* 401 / 403 everywhere: no or bad credentials, a role that may not do this;
* 404 everywhere: a missing object, a non-numeric id, an unknown `?format=`;
* 409 and 413 on the writing methods: a state that forbids the change or a lost race,
  a body over DATA_UPLOAD_MAX_MEMORY_SIZE.

A view that declares its own 4xx answers (with `extend_schema(responses=...)`, e.g. the
token endpoint, which asks for no credentials) is taken at its word; `error_responses()`
gives it the standard ones to start from.
"""
from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from backfill_portal.core.api import ID_LOOKUP

ERROR_DESCRIPTIONS = {
    "400": "Bad request: a field, parameter or body is invalid (the field is named in `errors`)",
    "401": "No credentials, or credentials that are not valid",
    "403": "Not allowed for this user (the reason is in `detail`)",
    "404": "No such object or route",
    "409": "Conflict: the object's state does not allow this, or a concurrent change won",
    "413": "The request body is too large",
}
WRITE_ONLY_ERRORS = {"409", "413"}
WRITING_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="what was refused and why, in one line")
    code = serializers.CharField(required=False, help_text="invalid, permission_denied, not_found, conflict, ...")
    errors = serializers.DictField(required=False, help_text="field name: its messages")

    class Meta:
        ref_name = "Error"


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """The standard error answers for `extend_schema(responses={...})`."""
    return {code: OpenApiResponse(ErrorSerializer, description=ERROR_DESCRIPTIONS[str(code)]) for code in codes}


class PortalAutoSchema(AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        for parameter in operation.get("parameters", []):
            # The route's digits-only regex (ID_LOOKUP) made it a string: it is an id.
            if parameter.get("in") == "path" and parameter.get("schema", {}).get("pattern") == f"^{ID_LOOKUP}$":
                parameter["schema"] = {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}
        responses = operation.setdefault("responses", {})
        if any(code.startswith("4") for code in responses):
            return operation  # the view documented its refusals itself
        error_ref = self.resolve_serializer(ErrorSerializer, "response").ref
        # Errors are written by the view's renderers too (JSON; CSV for a CSV export).
        media_types = next((list(r["content"]) for code, r in responses.items()
                            if code.startswith("2") and r.get("content")), None) or ["application/json"]
        for code, description in ERROR_DESCRIPTIONS.items():
            if code in WRITE_ONLY_ERRORS and method.upper() not in WRITING_METHODS:
                continue
            responses[code] = {"content": {mt: {"schema": error_ref} for mt in media_types}, "description": description}
        return operation
