"""Email notifications (Django's email backend; the console in development). Sent after
the transaction commits, so a rolled-back decision never mails anyone."""
from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction

logger = logging.getLogger(__name__)


def notify(*, users, subject: str, body: str) -> None:
    recipients = sorted({u.email for u in users if getattr(u, "email", "")})
    if not recipients:
        return

    def send():
        try:
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, recipients)
        except Exception:  # a mail outage must not undo or fail the decision
            logger.exception("could not send %r to %s", subject, recipients)

    transaction.on_commit(send)


def notify_approvers(request, steps) -> None:
    """Each approval step's approver, or the admins for admin steps."""
    admins = list(get_user_model().objects.filter(is_superuser=True).exclude(pk=request.requested_by_id))
    for step in steps:
        users = [step.approver] if step.approver_id else admins
        notify(users=users, subject=f"Approval needed: backfill request #{request.pk} ({step.get_kind_display()})",
               body=(f"{request.requested_by.username} asks to backfill {request.job.name} "
                     f"{request.first_partition}..{request.last_partition} ({request.interval_count} intervals).\n"
                     f"Reason: {request.reason}\nCascade: {request.cascade}. Decide in the portal's approvals inbox."))
