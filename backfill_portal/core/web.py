"""Helpers shared by the server-rendered pages: rendering with the navigation context,
htmx-aware redirects, keyset pagination, and the ONE place where an ApplicationError
becomes an HTTP status for the web UI (the API's twin is core.api.exception_handler).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django_htmx.http import HttpResponseLocation

from backfill_portal.core.errors import ApplicationError
from backfill_portal.core.roles import user_roles

PAGE_SIZE = 50


def is_htmx(request: HttpRequest) -> bool:
    # django_htmx's middleware sets request.htmx; fall back to the header for safety.
    htmx = getattr(request, "htmx", None)
    return bool(htmx) if htmx is not None else request.headers.get("HX-Request") == "true"


def render_page(request: HttpRequest, template: str, context: dict | None = None, *, status: int = 200) -> HttpResponse:
    """Render a template with the user's roles (base.html's navigation) added; the
    approvals inbox count comes from web.context_processors.navigation."""
    ctx = {"nav_roles": sorted(user_roles(request.user)), **(context or {})}
    return render(request, template, ctx, status=status)


def redirect_after_post(request: HttpRequest, to: str) -> HttpResponse:
    """PRG: a plain form gets a 302; an htmx request gets HX-Location (client-side
    navigation without a full reload, history pushed)."""
    if is_htmx(request):
        return HttpResponseLocation(to, target="body")
    return redirect(to)


# --- Application errors -----------------------------------------------------------------


def error_status(exc: ApplicationError) -> int:
    """The one mapping from an application error to an HTTP status for the web pages."""
    status = getattr(exc, "status_code", 400)
    return status if isinstance(status, int) and 400 <= status < 600 else 400


def error_messages(exc: ApplicationError) -> list[str]:
    """The main message plus any field messages that say something else."""
    out = [exc.message]
    for field_messages in exc.fields.values():
        out.extend(m for m in field_messages if m not in out)
    return out


def render_error(request: HttpRequest, exc: ApplicationError) -> HttpResponse:
    """A full error page (403 with the reason, 404, 409, ...); for htmx, the alert alone,
    swapped where the fragment would have gone."""
    status = error_status(exc)
    titles = {403: "Not allowed", 404: "Not found", 409: "Conflict"}
    ctx = {"status": status, "title": titles.get(status, "Request refused"), "messages_list": error_messages(exc),
           "code": exc.code, "audited": getattr(exc, "audited", False)}
    if is_htmx(request):
        return render(request, "errors/_application_error_alert.html", ctx, status=status)
    return render_page(request, "errors/application_error.html", ctx, status=status)


def flash_error(request: HttpRequest, exc: ApplicationError) -> int:
    """Put the refusal in the messages for the page about to be rendered; return its status."""
    for text in error_messages(exc):
        messages.error(request, text)
    return error_status(exc)


def application_errors(view):
    """Decorator: any ApplicationError that escapes a view becomes the error page."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except ApplicationError as exc:
            return render_error(request, exc)

    return wrapper


# --- Keyset pagination -------------------------------------------------------------------


@dataclass
class KeysetPage:
    rows: list
    next_before: int | str | None  # pass as ?before= for the next (older / smaller-key) page
    before: int | str | None  # the cursor this page was read with


def parse_int(value, *, minimum: int = 1) -> int | None:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if number >= minimum else None


def keyset_page(qs: QuerySet, before, *, size: int = PAGE_SIZE) -> KeysetPage:
    """Newest first by id; `before` is the smallest id already shown."""
    return _keyset(qs, "pk", parse_int(before), size)


def keyset_page_by(qs: QuerySet, field: str, before, *, size: int = PAGE_SIZE) -> KeysetPage:
    """Keyset pagination on a unique text key, largest first (partition keys sort in
    time order): `before` is the smallest key already shown."""
    return _keyset(qs, field, (str(before).strip()[:200] or None) if before else None, size)


def _keyset(qs: QuerySet, field: str, cursor, size: int) -> KeysetPage:
    """Reads size + 1 rows to learn whether there is a next page, so the cost is one
    query at any depth. Rows may be model instances or dicts (a values() query)."""
    if cursor is not None:
        qs = qs.filter(**{f"{field}__lt": cursor})
    rows = list(qs.order_by(f"-{field}")[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    last = rows[-1] if rows else None
    key = (last[field] if isinstance(last, dict) else getattr(last, field)) if last is not None else None
    return KeysetPage(rows=rows, next_before=key if more else None, before=cursor)


def query_without(request: HttpRequest, *keys: str) -> str:
    """The current query string minus some keys (for "next page" links keeping filters)."""
    params = request.GET.copy()
    for key in keys:
        params.pop(key, None)
    return params.urlencode()
