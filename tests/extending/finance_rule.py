"""A new approval rule in one file: every request on a dataset of a team listed in
SENSITIVE_TEAMS also needs an admin's approval, whatever its size."""
from __future__ import annotations

from django.conf import settings

from backfill_portal.backfills.approval_rules import ApprovalInput, PlannedStep, register_rule
from backfill_portal.backfills.choices import StepKind

SENSITIVE_TEAMS = {"finance"}


@register_rule("sensitive_team_admin", order=950)  # after admin_over_size (900)
def sensitive_team_admin(plan: ApprovalInput):
    size_asks_an_admin = plan.interval_count > settings.BACKFILL_ADMIN_APPROVAL_OVER  # one admin step is enough
    if plan.job.dataset.team.name in SENSITIVE_TEAMS and not size_asks_an_admin:
        yield PlannedStep(StepKind.ADMIN, None, None)
