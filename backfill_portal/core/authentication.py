"""Who is calling: API tokens, and what a sign-in lockout answers.

- `ApiTokenAuthentication`: `Authorization: Token <key>` (or `Bearer <key>`); expired,
  revoked and unknown keys are refused with 401. Listed first in REST_FRAMEWORK, so a
  call with no credentials at all is a 401 carrying its `WWW-Authenticate` challenge.
- `lockout_response`: django-axes' AXES_LOCKOUT_CALLABLE, the page (or JSON) a
  locked-out sign-in gets, HTTP 429 with Retry-After.
- `on_login_failed`: the receiver of Django's `user_login_failed` (sent by every
  sign-in path: the login page, the admin's, the token endpoint), which audits it.
  A signal because it is the one place all of them pass; it runs after axes' own
  receiver (axes comes first in INSTALLED_APPS), so the request already says whether
  this failure was refused by a lock or set one.
"""
from __future__ import annotations

import math
from datetime import timedelta

from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Max
from django.http import JsonResponse
from django.shortcuts import render
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from backfill_portal.core.models import ApiToken
from backfill_portal.core.services.auth import login_failure_record
from backfill_portal.core.services.tokens import token_key_hash

TOKEN_REALM = 'Token realm="api"'


class ApiTokenAuthentication(BaseAuthentication):
    keywords = (b"token", b"bearer")

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("invalid token header: send 'Authorization: Token <key>'")
        try:
            key = parts[1].decode("ascii")
        except UnicodeError:
            raise exceptions.AuthenticationFailed("invalid token header: the key has invalid characters") from None
        token = ApiToken.objects.select_related("user").filter(key_hash=token_key_hash(key)).first()
        if token is None:
            raise exceptions.AuthenticationFailed("invalid token")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("token revoked: get a new one from POST /api/auth/token/")
        if token.expires_at <= timezone.now():
            raise exceptions.AuthenticationFailed(
                f"token expired at {token.expires_at:%Y-%m-%d %H:%M} UTC: get a new one from POST /api/auth/token/")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("token of an inactive user")
        return token.user, token

    def authenticate_header(self, request):
        return TOKEN_REALM


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; get a key from POST /api/auth/token/ or `manage.py issue_token USER`. "
                           "Keys expire.",
        }


def lockout_seconds_left(username: str) -> int:
    """Seconds until the lock on `username` ends: the window runs from the failure that
    set it (the last one counted). The whole window when no failure is found."""
    window = settings.LOGIN_LOCKOUT_MINUTES * 60
    last = AccessAttempt.objects.filter(username=username).aggregate(last=Max("attempt_time"))["last"]
    if last is None:
        return window
    left = (last + timedelta(seconds=window) - timezone.now()).total_seconds()
    return max(1, min(window, math.ceil(left)))


def lockout_message(seconds_left: int) -> str:
    minutes = max(1, math.ceil(seconds_left / 60))
    return (f"This username is locked after {settings.LOGIN_FAILURE_LIMIT} failed sign-ins. "
            f"Try again in {minutes} minute{'s' if minutes != 1 else ''}, or ask an admin to unlock it.")


def locked_out_json(username: str) -> JsonResponse:
    left = lockout_seconds_left(username)
    response = JsonResponse({"detail": lockout_message(left), "code": "locked_out"}, status=429)
    response["Retry-After"] = str(left)
    return response


def lockout_response(request, original_response=None, credentials=None):
    """What axes answers a locked-out sign-in with: JSON for API and XHR callers, the
    lockout page for people."""
    username = str((credentials or {}).get("username") or request.POST.get("username") or "")
    if request.path.startswith("/api/") or request.headers.get("x-requested-with") == "XMLHttpRequest":
        return locked_out_json(username)
    left = lockout_seconds_left(username)
    response = render(request, "registration/locked_out.html", {"message": lockout_message(left)}, status=429)
    response["Retry-After"] = str(left)
    return response


def on_login_failed(sender, credentials, request=None, **kwargs):
    locked = bool(getattr(request, "axes_locked_out", False))
    # axes counts a failure (and sets the failure count) unless a lock refused it first.
    counted = getattr(request, "axes_failures_since_start", None) is not None
    login_failure_record(
        username=str(credentials.get("username") or ""),
        ip_address=getattr(request, "axes_ip_address", None) or (request.META.get("REMOTE_ADDR") if request else None),
        path=getattr(request, "path", "") or "",
        refused_while_locked=locked and not counted,
        locked_now=locked and counted,
    )
