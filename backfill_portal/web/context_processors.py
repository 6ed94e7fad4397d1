"""What base.html's navigation needs beyond core.web.render_page's roles: the count of
the approvals inbox. It lives here, not in core, because counting it reads backfills."""
from __future__ import annotations

from functools import cache

from backfill_portal.backfills.policy import may_create
from backfill_portal.backfills.selectors import waiting_count


def inbox_count(user) -> int | None:
    """How many approval steps and hand-off items wait for this user (None: nobody is
    signed in), in one query (`waiting_count`)."""
    if not getattr(user, "is_authenticated", False):
        return None
    return waiting_count(user)


def navigation(request) -> dict:
    """`nav_inbox` for every template rendered with a request, and `can_file`: whether to
    offer the request form at all (the auditor is never offered it). A template calls it when
    it shows it, once per render (cached): a partial that does not show it costs no query.
    A view's own `nav_inbox` (the htmx out-of-band count after a decision) wins."""

    @cache
    def nav_inbox() -> int | None:
        return inbox_count(request.user)

    @cache
    def can_file() -> bool:
        return may_create(request.user)

    return {"nav_inbox": nav_inbox, "can_file": can_file}
