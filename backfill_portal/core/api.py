"""The one place where application errors become HTTP answers for the API."""
from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse
from django.views import defaults
from rest_framework import exceptions as drf_exceptions
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from backfill_portal.core.errors import ApplicationError, Unavailable
from backfill_portal.core.middleware import (
    api_not_found,
    database_busy_response,
    is_api_path,
    is_pool_timeout,
    unavailable_response,
)

logger = logging.getLogger(__name__)


def body_too_large_message() -> str:
    return f"the request body is larger than the {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes allowed"


def error_code(exc) -> str:
    if isinstance(exc, drf_exceptions.APIException):
        codes = exc.get_codes()
        return codes if isinstance(codes, str) else exc.default_code
    if isinstance(exc, Http404):
        return "not_found"
    if isinstance(exc, DjangoPermissionDenied):
        return "permission_denied"
    return "error"


def first_error(detail, path: tuple[str, ...] = ()) -> tuple[str, str]:
    """(where, message) of the first message in a serializer's errors, however nested:
    a list field's errors are {index: [...]}, a list of objects' are [{}, {...}], so
    the path names the item ("side_effects.0")."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            if value:
                return first_error(value, (*path, str(key)))
    elif isinstance(detail, list):
        for index, value in enumerate(detail):
            if isinstance(value, str):
                return ".".join(path), str(value)
            if value:
                return first_error(value, (*path, str(index)))
    elif detail:
        return ".".join(path), str(detail)
    return ".".join(path), "invalid"


def exception_handler(exc, context):
    if isinstance(exc, ApplicationError):
        return Response(exc.as_dict(), status=exc.status_code)
    if isinstance(exc, drf_exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        where, message = first_error(detail)
        return Response({"detail": f"{where}: {message}", "code": "invalid", "errors": detail},
                        status=status.HTTP_400_BAD_REQUEST)
    # Django refuses an oversized body (DATA_UPLOAD_MAX_MEMORY_SIZE) while DRF parses it.
    if isinstance(exc, RequestDataTooBig):
        return Response({"detail": body_too_large_message(), "code": "too_large"},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, SuspiciousOperation):  # too many fields or files, a malformed multipart body, ...
        return Response({"detail": f"bad request: {exc}", "code": "invalid"}, status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is not None:
        # DRF's own refusals (a body that is not JSON, no credentials, an unknown
        # ?format=) get a code like every other error body.
        if isinstance(response.data, dict) and "detail" in response.data:
            response.data.setdefault("code", error_code(exc))
        return response
    if isinstance(exc, (Http404, DjangoPermissionDenied)):
        return drf_exception_handler(exc, context)
    if is_pool_timeout(exc):  # no metadata connection free: a 503 to retry, not an error
        return database_busy_response(context["request"])
    if isinstance(exc, Unavailable):  # the warehouse (or another service) is down: 503, not 500
        logger.warning("503 for %s: %s", context["request"].path, exc)
        return unavailable_response(context["request"], exc)
    # Never a traceback to the user: log it, answer with a generic 500 body.
    logger.exception("unhandled API error")
    return Response({"detail": "internal error; it has been logged", "code": "error"},
                    status=status.HTTP_500_INTERNAL_SERVER_ERROR)


# -- the project's handler404 / handler500: JSON under /api/, the pages elsewhere ------------

def not_found(request, exception=None):
    """A URL no route matches (e.g. a non-numeric id where the route takes digits only)."""
    if is_api_path(request.path):
        return api_not_found()
    return defaults.page_not_found(request, exception)


def bad_request(request, exception=None):
    """A request Django could not read (a body over the limits, too many fields, a bad
    Host): a 400 in the API's JSON under /api/, the bare 400 page elsewhere."""
    if is_api_path(request.path):
        return JsonResponse({"detail": "the request could not be read: too large, too many fields or malformed; "
                                       "nothing was changed", "code": "invalid"}, status=400)
    return defaults.bad_request(request, exception)


def server_error(request):
    if is_api_path(request.path):
        return JsonResponse({"detail": "internal error; it has been logged", "code": "error"}, status=500)
    return defaults.server_error(request)


# Routes taking a numeric id match digits only (at most 18: any bigint), so "abc", "1.5"
# or a 40-digit number is a 404 from the URL resolver, never a ValueError in a lookup.
ID_LOOKUP = r"[0-9]{1,18}"
