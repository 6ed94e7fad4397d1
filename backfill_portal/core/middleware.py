"""Request guards that run before any view touches the database."""
from __future__ import annotations

import contextvars
import time
import logging
from urllib.parse import unquote_to_bytes

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve

from backfill_portal.core.errors import Unavailable
from backfill_portal.core.startup import one_line, probe_database

logger = logging.getLogger(__name__)

NUL_MESSAGE = "a NUL character (%00) is not allowed in the path, the query string, a header or a form field"
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def is_api_path(path: str) -> bool:
    return path.startswith("/api/")


def has_nul_byte(request: HttpRequest) -> bool:
    """Whether a NUL byte hides in the path, the query string, a header value or a form field.
    PostgreSQL cannot store one in text, so any lookup with it would fail in the driver."""
    if "\x00" in request.path:
        return True
    if b"\x00" in unquote_to_bytes(request.META.get("QUERY_STRING", "")):
        return True
    if any("\x00" in value for key, value in request.META.items()
           if key.startswith("HTTP_") and isinstance(value, str)):
        return True
    # A form's fields (a JSON body's are refused by its parser, core/parsers.py), read
    # as the view would. A body over the upload limit is left to the view, which refuses
    # it as before (the API's 413); too many fields, or a multipart body that cannot be
    # parsed, is a 400 here (handler400), as Django would answer in the view.
    # (Not under /api/: DRF parses those bodies itself, refusing a NUL in any field, and
    # answers a body it cannot parse with its own 400, with nothing in the server log.)
    if request.method == "POST" and request.content_type in FORM_TYPES and not is_api_path(request.path):
        from django.conf import settings

        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return False
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            return False
        from django.core.exceptions import BadRequest
        from django.http.multipartparser import MultiPartParserError

        try:
            fields = request.POST.lists()
        except MultiPartParserError as exc:  # a malformed body: a 400, not a form read as empty
            raise BadRequest(f"the form's body could not be read: {exc}") from None
        return any("\x00" in key or any("\x00" in value for value in values) for key, values in fields)
    return False


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


_current_request: contextvars.ContextVar[HttpRequest | None] = contextvars.ContextVar("current_request", default=None)


class RequestActorMiddleware:
    """Remembers the request being answered, so that an audit row written where no
    request is passed (the receivers that audit a role change made in Django's admin,
    core/role_audit.py) can still name who made it (`request_actor`)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = _current_request.set(request)
        try:
            return self.get_response(request)
        finally:
            _current_request.reset(token)


def request_actor():
    """The signed-in user of the request being answered (an API call's too: DRF sets
    the user it authenticated on the request), else None: no request, or nobody
    signed in (a management command, a Celery task)."""
    request = _current_request.get()
    user = getattr(request, "user", None) if request is not None else None
    return user if getattr(user, "is_authenticated", False) else None


def api_not_found() -> JsonResponse:
    """The API's 404 body for a URL that matches no route (core.api.not_found)."""
    return JsonResponse({"detail": "Not found.", "code": "not_found"}, status=404)


class ApiNotFoundMiddleware:
    """Every 404 under /api/ is a JSON error body, with DEBUG on too. handler404
    (core.api.not_found) gives it only with DEBUG off: with DEBUG on, Django answers a
    URL that matches no route (`/api/nothing/`, `/api/requests/abc/`) with its HTML
    debug page. A DRF view's own 404 is left alone: it is already the error body in
    the format the client negotiated."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (response.status_code == 404 and is_api_path(request.path)
                and not hasattr(response, "accepted_renderer")  # a DRF Response
                and not response.get("Content-Type", "").startswith("application/json")):
            return api_not_found()
        return response


class MethodNotAllowedPageMiddleware:
    """A page's action address (approve, cancel, log out, ...) takes a form's POST. A
    visit to it (the address bar, after an action refused with its message) got
    Django's empty 405: a blank page. It gets a page with the navigation and a link to
    the nearest page above it instead, the Allow header kept. /api/ is DRF's (JSON)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 405 or is_api_path(request.path) or response.content:
            return response
        page = render(request, "405.html", {"back": page_above(request.path)}, status=405)
        page["Allow"] = response.get("Allow", "")
        return page


def page_above(path: str) -> str:
    """The nearest path above `path` that is a route ("/requests/3/" above
    "/requests/3/approve/"), else "/"."""
    parts = [part for part in path.split("/") if part]
    while parts:
        parts.pop()
        candidate = "/" + "".join(f"{part}/" for part in parts)
        try:
            resolve(candidate)
        except Resolver404:
            continue
        return candidate
    return "/"


# Paths that answer without the metadata connection a request would otherwise take
# first: liveness touches no database; readiness checks it itself and says so.
WITHOUT_CONNECTION = ("/healthz", "/readyz")


def is_pool_timeout(exc: BaseException | None) -> bool:
    """Whether `exc` is the connection pool's "no connection free within
    DATABASE_POOL_TIMEOUT" (Django raises its OperationalError from psycopg_pool's
    PoolTimeout). With a pool that is also what an unreachable server looks like."""
    from psycopg_pool import PoolTimeout

    while exc is not None:
        if isinstance(exc, PoolTimeout):
            return True
        exc = exc.__cause__
    return False


# How long a process trusts its last probe of the metadata database: under saturation
# every refused request would otherwise open one more connection to the busy server.
DOWN_PROBE_SECONDS = 5.0
_last_probe: tuple[float, str | None] | None = None  # (when, the reason or None)


def database_down_reason() -> str | None:
    """After the pool's wait ran out: whether the server itself is down (a connection of
    its own, short connect timeout), and the driver's reason, or None (it answers: busy).
    One probe per process every DOWN_PROBE_SECONDS; the requests refused meanwhile
    reuse its answer."""
    global _last_probe
    now = time.monotonic()
    if _last_probe is not None and now - _last_probe[0] < DOWN_PROBE_SECONDS:
        return _last_probe[1]
    try:
        probe_database(timeout=2)
    except Exception as exc:
        reason = one_line(exc)
    else:
        reason = None
    _last_probe = (time.monotonic(), reason)
    return reason


def database_busy_response(request: HttpRequest) -> HttpResponse:
    """503 with Retry-After: the request changed nothing, the same request later may pass."""
    from django.conf import settings
    from django.template.loader import render_to_string

    seconds = settings.DATABASE_POOL_TIMEOUT
    down = database_down_reason()
    if down:
        message = f"the metadata database does not answer ({down}); nothing was changed, try again shortly"
    else:
        message = (f"the portal is busy: no metadata database connection became free within {seconds:g} s "
                   "(every one of this process's connections is in use); nothing was changed, try again shortly")
    if is_api_path(request.path):
        response = JsonResponse({"detail": message, "code": "database_busy"}, status=503)
    else:
        response = HttpResponse(render_to_string("503.html", {"message": message}), status=503)
    response["Retry-After"] = str(max(1, round(seconds)))
    return response


def unavailable_response(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """503 with Retry-After for a service the portal needs that is down (the warehouse
    refused the connection, ...): the operator's problem, not the user's input, so
    neither a 400 nor a 500; the message names the service and the driver's reason."""
    from django.template.loader import render_to_string

    message = f"{one_line(exc)}; try again when it is back"
    if is_api_path(request.path):
        response = JsonResponse({"detail": message, "code": "unavailable"}, status=503)
    else:
        response = HttpResponse(render_to_string("503.html", {"message": message, "title": "Unavailable"}),
                                status=503)
    response["Retry-After"] = "10"
    return response


class MetadataConnectionMiddleware:
    """With a connection pool (web processes on PostgreSQL: settings.database_config),
    a request takes its metadata connection here, before the session, the user or a
    token is looked up: it either has one for the rest of the request (Django hands it
    back when the request ends) or is a 503 naming the cause, never a 500 from
    whichever lookup came first. Without a pool (SQLite, management commands) it does
    nothing."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from django.db import OperationalError, connection

        if getattr(connection, "pool", None) is not None and request.path not in WITHOUT_CONNECTION:
            try:
                connection.ensure_connection()
            except OperationalError as exc:
                if not is_pool_timeout(exc):
                    raise
                logger.warning("503 for %s %s: %s", request.method, request.path, exc)
                return database_busy_response(request)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        # A view that gave its connection back and waited in vain for another.
        if is_pool_timeout(exception):
            logger.warning("503 for %s %s: %s", request.method, request.path, exception)
            return database_busy_response(request)
        if isinstance(exception, Unavailable):  # the warehouse (or another service) is down
            logger.warning("503 for %s %s: %s", request.method, request.path, exception)
            return unavailable_response(request, exception)
        return None
