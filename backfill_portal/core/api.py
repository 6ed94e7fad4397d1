"""The one place where application errors become HTTP answers for the API."""
from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from backfill_portal.core.errors import ApplicationError

logger = logging.getLogger(__name__)


def exception_handler(exc, context):
    if isinstance(exc, ApplicationError):
        return Response(exc.as_dict(), status=exc.status_code)
    if isinstance(exc, drf_exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        first = next(iter(detail.items()), ("", [""]))
        message = first[1][0] if isinstance(first[1], list) and first[1] else str(first[1])
        return Response({"detail": f"{first[0]}: {message}", "code": "invalid", "errors": detail},
                        status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is not None:
        return response
    if isinstance(exc, (Http404, DjangoPermissionDenied)):
        return drf_exception_handler(exc, context)
    # Never a traceback to the user: log it, answer with a generic 500 body.
    logger.exception("unhandled API error")
    return Response({"detail": "internal error; it has been logged", "code": "error"},
                    status=status.HTTP_500_INTERNAL_SERVER_ERROR)
