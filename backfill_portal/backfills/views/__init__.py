"""Backfill pages: requests (list, new with its preview, detail and its live partial,
the POST actions), the approvals inbox and reconciliation. Views parse, call one
service, and render; the services decide."""
from backfill_portal.backfills.views.approvals import approval_step_decide_view, approvals, handoff_decide_view
from backfill_portal.backfills.views.reconciliation import (
    reconciliation,
    reconciliation_explain,
    reconciliation_recompute_view,
    reconciliation_signoff_view,
)
from backfill_portal.backfills.views.requests import (
    request_approve,
    request_cancel,
    request_detail,
    request_list,
    request_live,
    request_new,
    request_pause_view,
    request_preview,
    request_reject,
    request_resume_view,
    request_retry_view,
    request_rollback_view,
    request_submit,
)

__all__ = [
    "approval_step_decide_view", "approvals", "handoff_decide_view",
    "reconciliation", "reconciliation_explain", "reconciliation_recompute_view", "reconciliation_signoff_view",
    "request_approve", "request_cancel", "request_detail", "request_list", "request_live", "request_new",
    "request_pause_view", "request_preview", "request_reject", "request_resume_view", "request_retry_view",
    "request_rollback_view", "request_submit",
]
