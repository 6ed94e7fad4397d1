"""Sign-in refusals, written to the audit log (in their own transaction: the sign-in
they refused never happened, so there is nothing to commit them with)."""
from __future__ import annotations

from django.conf import settings
from django.db import transaction

from backfill_portal.core.services.audit import audit_record

# Who a failed sign-in is attributed to: nobody has proved who they are yet.
ANONYMOUS = "anonymous"


def login_failure_record(*, username: str, ip_address: str | None, path: str, refused_while_locked: bool,
                         locked_now: bool) -> None:
    """Audit one failed sign-in (`denied.login`), and the lockout it set off, if it did
    (`login.locked_out`). The password is never recorded."""
    username = (username or "")[:150]
    data = {"username": username, "ip_address": ip_address or "", "path": path[:200]}
    if refused_while_locked:
        reason = "username locked after repeated failed sign-ins; the password was not checked"
    else:
        reason = "wrong username or password"
    with transaction.atomic():
        audit_record(actor=ANONYMOUS, action="denied.login", object_type="user", object_id=username[:64] or "-",
                     reason=reason, data={**data, "refused_while_locked": refused_while_locked})
        if locked_now:
            audit_record(actor=ANONYMOUS, action="login.locked_out", object_type="user",
                         object_id=username[:64] or "-",
                         reason=f"{settings.LOGIN_FAILURE_LIMIT} failed sign-ins: locked for "
                                f"{settings.LOGIN_LOCKOUT_MINUTES} minutes",
                         data={**data, "failure_limit": settings.LOGIN_FAILURE_LIMIT,
                               "lockout_minutes": settings.LOGIN_LOCKOUT_MINUTES})
