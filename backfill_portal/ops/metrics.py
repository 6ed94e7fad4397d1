"""Prometheus metrics, computed from the metadata database at scrape time.

Nothing is counted in a process's memory: every number is a query over the rows the
workers already write (runs, attempts, the task outbox, publications, check results,
audit events). So a scrape of any web process on any host returns the same figures,
however many worker processes on however many hosts did the work, and a restart
loses nothing. Counters (`_total`) count rows in terminal states, which only grow.

One scrape is a dozen aggregate queries; the publication histogram reads every
publication (a few ms per 10,000).
"""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, DurationField, ExpressionWrapper, F, IntegerField, Min, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import AttemptStatus, RunStatus, RunType
from backfill_portal.execution.models import Attempt, CheckResult, Run, TaskOutbox
from backfill_portal.execution.queue import BACKFILL_QUEUE, PRODUCTION_QUEUE
from backfill_portal.execution.services.sweep import SWEEP_ACTION, SWEEP_COUNTS
from backfill_portal.warehouse.models import Publication

# Runs whose next task waits for a worker: `queued` for execute, `staged` for verify.
WAITING = (RunStatus.QUEUED, RunStatus.STAGED)
# Seconds from a version's commit (rows and marker written) to its publication.
PUBLISH_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)


def queue_of(run_type: str) -> str:
    # As execution.services.dispatch.run_queue: scheduled runs go ahead on their own queue.
    return PRODUCTION_QUEUE if run_type == RunType.SCHEDULED else BACKFILL_QUEUE


class PortalCollector:
    """A prometheus_client collector: yields metric families built from the database."""

    def collect(self):
        now = timezone.now()
        yield from self._runs()
        yield from self._queues(now)
        yield from self._attempts()
        yield from self._verification()
        yield from self._outbox(now)
        yield self._publish_latency()
        yield self._sweeper()
        yield self._requests()

    def _runs(self):
        runs = GaugeMetricFamily("backfill_runs", "Runs in each state, by run type.", labels=["state", "type"])
        counts = {(row["status"], row["run_type"]): row["n"]
                  for row in Run.objects.order_by().values("status", "run_type").annotate(n=Count("id"))}
        # Every pair, zeros included, so a series does not vanish when its last run moves on.
        for state in RunStatus.values:
            for run_type in RunType.values:
                runs.add_metric([state, run_type], counts.get((state, run_type), 0))
        yield runs

    def _queues(self, now):
        depth = GaugeMetricFamily("backfill_queue_depth",
                                  "Runs whose next task waits for a worker (queued or staged), per queue.",
                                  labels=["queue"])
        oldest = GaugeMetricFamily("backfill_queue_oldest_age_seconds",
                                   "Age of the oldest waiting run's task, per queue (0 when none waits).",
                                   labels=["queue"])
        per_queue = {PRODUCTION_QUEUE: [0, None], BACKFILL_QUEUE: [0, None]}
        rows = (Run.objects.filter(status__in=WAITING).order_by().values("run_type")
                .annotate(n=Count("id"), since=Min("enqueued_at"), created=Min("created_at")))
        for row in rows:
            entry = per_queue[queue_of(row["run_type"])]
            entry[0] += row["n"]
            since = row["since"] or row["created"]
            if since is not None and (entry[1] is None or since < entry[1]):
                entry[1] = since
        for queue, (n, since) in per_queue.items():
            depth.add_metric([queue], n)
            oldest.add_metric([queue], max(0.0, (now - since).total_seconds()) if since else 0.0)
        yield depth
        yield oldest

    def _attempts(self):
        counts = dict(Attempt.objects.order_by().values_list("status").annotate(n=Count("id")))
        running = GaugeMetricFamily("backfill_attempts_running", "Attempts running now.")
        running.add_metric([], counts.get(AttemptStatus.RUNNING, 0))
        yield running
        finished = CounterMetricFamily("backfill_attempts_finished", "Attempts ended, by outcome.",
                                       labels=["outcome"])
        for outcome in (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.LOST):
            finished.add_metric([outcome], counts.get(outcome, 0))
        yield finished
        lost = CounterMetricFamily("backfill_attempts_lost",
                                   "Attempts marked lost by the sweeper (heartbeat expired: worker or its link died).")
        lost.add_metric([], counts.get(AttemptStatus.LOST, 0))
        yield lost

    def _verification(self):
        failures = CounterMetricFamily("backfill_verification_failures",
                                       "Runs that failed verification (nothing published).")
        failures.add_metric([], Run.objects.filter(status=RunStatus.VERIFICATION_FAILED).count())
        yield failures
        checks = CounterMetricFamily("backfill_check_failures", "Failed verification checks, by check.",
                                     labels=["check", "blocking"])
        for name, blocking, n in (CheckResult.objects.filter(passed=False).order_by()
                                  .values_list("name", "blocking").annotate(n=Count("id"))):
            checks.add_metric([name, "true" if blocking else "false"], n)
        yield checks

    def _outbox(self, now):
        unsent = TaskOutbox.objects.filter(sent_at__isnull=True).aggregate(n=Count("id"), oldest=Min("created_at"))
        backlog = GaugeMetricFamily("backfill_outbox_backlog", "Task outbox rows committed but not yet sent.")
        backlog.add_metric([], unsent["n"])
        yield backlog
        oldest = GaugeMetricFamily("backfill_outbox_oldest_age_seconds",
                                   "Age of the oldest unsent outbox row (0 when none).")
        oldest.add_metric([], max(0.0, (now - unsent["oldest"]).total_seconds()) if unsent["oldest"] else 0.0)
        yield oldest

    def _publish_latency(self):
        latency = ExpressionWrapper(F("published_at") - F("version__committed_at"), output_field=DurationField())
        buckets = {f"le_{i}": Count("id", filter=Q(latency__lte=timedelta(seconds=b)))
                   for i, b in enumerate(PUBLISH_LATENCY_BUCKETS)}
        row = (Publication.objects.filter(action=Publication.Action.PUBLISH).order_by()
               .annotate(latency=latency).aggregate(n=Count("id"), total=Sum("latency"), **buckets))
        family = HistogramMetricFamily(
            "backfill_publish_latency_seconds",
            "Seconds from a version's commit (rows and marker written) to its publication (visible to readers).")
        cumulative = [(str(float(b)), row[f"le_{i}"]) for i, b in enumerate(PUBLISH_LATENCY_BUCKETS)]
        total = row["total"]
        family.add_metric([], cumulative + [("+Inf", row["n"])],
                          sum_value=total.total_seconds() if isinstance(total, timedelta) else float(total or 0) / 1e6)
        return family

    def _sweeper(self):
        """What the sweeper repaired, from its audit rows (one per sweep that found work)."""
        sums = {name: Sum(Cast(KeyTextTransform(name, "data"), IntegerField())) for name in SWEEP_COUNTS}
        row = AuditEvent.objects.filter(action=SWEEP_ACTION).order_by().aggregate(**sums)
        family = CounterMetricFamily("backfill_sweeper_actions",
                                     "Repairs made by the sweeper: attempts marked lost, verifications reclaimed, "
                                     "outbox rows re-sent, tasks of stale runs re-sent, work resumed after an "
                                     "outage, approved requests started, cancelled requests' runs stopped, runs "
                                     "dispatched into free slots, lost reconciliations computed, hand-offs opened, "
                                     "runs whose OpenLineage events were sent again.",
                                     labels=["action"])
        for name in SWEEP_COUNTS:
            family.add_metric([name], row[name] or 0)
        return family

    def _requests(self):
        family = GaugeMetricFamily("backfill_requests", "Backfill requests in each state.", labels=["state"])
        counts = dict(BackfillRequest.objects.order_by().values_list("status").annotate(n=Count("id")))
        for state in RequestStatus.values:
            family.add_metric([state], counts.get(state, 0))
        return family


# Only the portal's collector: per-process figures (CPU, memory of one gunicorn worker)
# would differ from scrape to scrape depending on which process answered.
registry = CollectorRegistry(auto_describe=False)
registry.register(PortalCollector())
