"""What happens after a request's decision commits. Execution takes over from here."""
from __future__ import annotations


def request_approved(request_id: int) -> None:
    from backfill_portal.execution.services.dispatch import request_start_after_approval

    request_start_after_approval(request_id=request_id)


def request_cancelled(request_id: int) -> None:
    from backfill_portal.execution.services.dispatch import request_stop_runs

    request_stop_runs(request_id=request_id)


def request_reconciling(request_id: int) -> None:
    """No work left: open hand-off items (hand-off cascades) and reconcile."""
    from backfill_portal.backfills.services.handoff import handoffs_open_for

    handoffs_open_for(request_id=request_id)
