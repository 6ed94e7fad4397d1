"""Celery tasks: take ids, re-read state, call one service. Safe to run twice, so a task
the database aborted to break a deadlock is sent again (core.retry)."""
from __future__ import annotations

from celery import shared_task

from backfill_portal.core.retry import send_again_if_deadlocked
from backfill_portal.execution.lineage_out.outbox import lineage_events_send
from backfill_portal.execution.services.bundles import runs_execute_bundle
from backfill_portal.execution.services.dispatch import warehouse_probe_and_resume
from backfill_portal.execution.services.dispatch import dispatch_request as dispatch_request_service
from backfill_portal.execution.services.schedule import schedule_production as schedule_production_service
from backfill_portal.execution.services.sweep import sweep_run
from backfill_portal.execution.services.verify import run_execute_and_verify, run_verify


@shared_task(name="execution.dispatch_request", bind=True, acks_late=True)
def dispatch_request(self, request_id: int) -> int:
    return send_again_if_deadlocked(self, lambda: dispatch_request_service(request_id=request_id))


@shared_task(name="execution.execute_run", bind=True, acks_late=True)
def execute_run(self, run_id: str) -> str:
    """The run's next attempt, then (once staged) its verification and publication."""
    return send_again_if_deadlocked(
        self, lambda: run_execute_and_verify(run_id=run_id, worker=self.request.hostname or ""))


@shared_task(name="execution.execute_bundle", bind=True, acks_late=True)
def execute_bundle(self, run_ids: list[str]) -> dict[str, str]:
    """Several queued runs of one request's cheap job, step by step together
    (services/bundles.py); each run as the execute task would take it."""
    return send_again_if_deadlocked(
        self, lambda: runs_execute_bundle(run_ids=list(run_ids), worker=self.request.hostname or ""))


@shared_task(name="execution.verify_run", bind=True, acks_late=True)
def verify_run(self, run_id: str) -> str:
    return send_again_if_deadlocked(self, lambda: run_verify(run_id=run_id))


@shared_task(name="execution.sweep")
def sweep() -> dict:
    """Lost attempts and verifications, unsent outbox rows, lost messages, a warehouse back
    from an outage, running requests with free slots."""
    return sweep_run(actor=None)


@shared_task(name="execution.probe_warehouse")
def probe_warehouse() -> int:
    """While the warehouse refuses connections, try it; resume the held work once it answers."""
    return warehouse_probe_and_resume()


@shared_task(name="execution.schedule_production")
def schedule_production() -> list[str]:
    return schedule_production_service()



@shared_task(name="execution.send_lineage_events", acks_late=True)
def send_lineage_events(event_id: int) -> str:
    """Send a run's unsent OpenLineage events up to this one, in order (each under a lease)."""
    return lineage_events_send(event_id=event_id)
