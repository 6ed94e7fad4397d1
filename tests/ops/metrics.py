"""Reading /metrics as Prometheus would (its own text parser), and what the database
says the same numbers must be."""
from __future__ import annotations

from collections import Counter

from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus, RunType
from backfill_portal.execution.models import Attempt, Run, TaskOutbox
from backfill_portal.execution.services.sweep import SWEEP_COUNTS
from backfill_portal.warehouse.models import Publication


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of labels): value} for every sample of the scrape."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def assert_matches_database(samples: dict) -> None:
    """Every database-backed figure of the scrape against a count made here, row by row."""
    runs = Counter((run.status, run.run_type) for run in Run.objects.all())
    for state in RunStatus.values:
        for run_type in RunType.values:
            assert value(samples, "backfill_runs", state=state, type=run_type) == runs[(state, run_type)], (state, run_type)
    waiting = [run for run in Run.objects.all() if run.status in (RunStatus.QUEUED, RunStatus.STAGED)]
    backfill_waiting = [run for run in waiting if run.run_type != RunType.SCHEDULED]
    assert value(samples, "backfill_queue_depth", queue="backfill") == len(backfill_waiting)
    assert value(samples, "backfill_queue_depth", queue="production") == len(waiting) - len(backfill_waiting)
    if not backfill_waiting:
        assert value(samples, "backfill_queue_oldest_age_seconds", queue="backfill") == 0
    else:
        oldest = min(run.enqueued_at or run.created_at for run in backfill_waiting)
        assert value(samples, "backfill_queue_oldest_age_seconds", queue="backfill") <= (timezone.now() - oldest).total_seconds()
    attempts = Counter(attempt.status for attempt in Attempt.objects.all())
    assert value(samples, "backfill_attempts_running") == attempts[AttemptStatus.RUNNING]
    for outcome in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.LOST):
        assert value(samples, "backfill_attempts_finished_total", outcome=outcome) == attempts[outcome]
    assert value(samples, "backfill_attempts_lost_total") == attempts[AttemptStatus.LOST]
    assert value(samples, "backfill_verification_failures_total") == runs_in(RunStatus.VERIFICATION_FAILED)
    assert value(samples, "backfill_outbox_backlog") == TaskOutbox.objects.filter(sent_at__isnull=True).count()
    publications = list(Publication.objects.filter(action="publish").select_related("version"))
    assert value(samples, "backfill_publish_latency_seconds_count") == len(publications)
    assert value(samples, "backfill_publish_latency_seconds_bucket", le="+Inf") == len(publications)
    latencies = [(p.published_at - p.version.committed_at).total_seconds() for p in publications]
    assert abs(value(samples, "backfill_publish_latency_seconds_sum") - sum(latencies)) < 1e-3
    assert value(samples, "backfill_publish_latency_seconds_bucket", le="60.0") == sum(1 for s in latencies if s <= 60)
    requests = Counter(BackfillRequest.objects.values_list("status", flat=True))
    for state, n in requests.items():
        assert value(samples, "backfill_requests", state=state) == n
    sweeps = [event.data for event in AuditEvent.objects.filter(action="sweep.repaired")]
    for action in SWEEP_COUNTS:
        assert value(samples, "backfill_sweeper_actions_total", action=action) == sum(d[action] for d in sweeps)


def runs_in(status: str) -> int:
    return Run.objects.filter(status=status).count()
