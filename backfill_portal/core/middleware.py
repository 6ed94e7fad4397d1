"""Request guards that run before any view touches the database."""
from __future__ import annotations

from urllib.parse import unquote_to_bytes

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

NUL_MESSAGE = "a NUL character (%00) is not allowed in the path, the query string or a header"


def is_api_path(path: str) -> bool:
    return path.startswith("/api/")


def has_nul_byte(request: HttpRequest) -> bool:
    """Whether a NUL byte hides in the path, the query string or a header value.
    PostgreSQL cannot store one in text, so any lookup with it would fail in the driver."""
    if "\x00" in request.path:
        return True
    if b"\x00" in unquote_to_bytes(request.META.get("QUERY_STRING", "")):
        return True
    return any("\x00" in value for key, value in request.META.items()
               if key.startswith("HTTP_") and isinstance(value, str))


class RejectNulBytesMiddleware:
    """A NUL byte anywhere a lookup could read it is a 400 before any session, token or
    row is looked up: JSON for the API, a one-line text answer for the pages."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if has_nul_byte(request):
            if is_api_path(request.path):
                return JsonResponse({"detail": NUL_MESSAGE, "code": "invalid"}, status=400)
            return HttpResponseBadRequest(f"Bad request: {NUL_MESSAGE}.\n", content_type="text/plain; charset=utf-8")
        return self.get_response(request)
