"""API tokens: issued to a user for a number of days, revoked; each change audited in
its own transaction. Only a SHA-256 of a key is stored; the key is shown once."""
from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from backfill_portal.core.errors import ConflictError, ValidationError
from backfill_portal.core.models import ApiToken
from backfill_portal.core.services.audit import audit_record

KEY_PREFIX = "bfp_"


def token_key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_token_issue(*, actor, user, days: int | None = None, label: str = "", via: str) -> tuple[ApiToken, str]:
    """A new token for `user`, valid `days` (API_TOKEN_DAYS when not given).
    Returns the row and the key; the key cannot be had again later."""
    days = settings.API_TOKEN_DAYS if days is None else days
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        raise ValidationError(f"days must be a whole number from 1 to {settings.API_TOKEN_MAX_DAYS}", field="days")
    label = (label or "").strip()
    if len(label) > 100:
        raise ValidationError("label must be at most 100 characters", field="label")
    if not user.is_active:
        raise ValidationError(f"user {user.username} is inactive: no token is issued", field="username")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, label=label, key_hash=token_key_hash(key), prefix=key[:12],
                                        created_at=now, expires_at=now + timedelta(days=days))
        audit_record(actor=actor, action="token.issue", object_type="api_token", object_id=token.pk, reason=label,
                     data={"user": user.username, "prefix": token.prefix, "days": days,
                           "expires_at": token.expires_at.isoformat(), "via": via})
    return token, key


def api_token_revoke(*, actor, token: ApiToken) -> ApiToken:
    """Revoke a token (it is kept, as a record). A second revoke is a conflict."""
    now = timezone.now()
    with transaction.atomic():
        if ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now) != 1:
            raise ConflictError("this token is already revoked")
        audit_record(actor=actor, action="token.revoke", object_type="api_token", object_id=token.pk,
                     data={"user": token.user.username, "prefix": token.prefix})
    token.revoked_at = now
    return token
