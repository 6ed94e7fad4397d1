"""Runs and attempts. Identity is job + data interval + run_id + attempt_no."""
from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models

from backfill_portal.execution.choices import AttemptStatus, RunStatus, RunType


def new_run_id() -> str:
    # Short, URL-safe, sortable enough for humans; travels in headers, logs and warehouse rows.
    return "run_" + secrets.token_hex(8)


class Run(models.Model):
    run_id = models.CharField(max_length=40, unique=True, default=new_run_id)
    job = models.ForeignKey("catalog.Job", on_delete=models.PROTECT, related_name="runs")
    run_type = models.CharField(max_length=12, choices=RunType.choices)
    request = models.ForeignKey("backfills.BackfillRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    interval = models.ForeignKey("backfills.Interval", null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    partition_key = models.CharField(max_length=40)
    data_interval_start = models.DateTimeField()
    data_interval_end = models.DateTimeField()
    code_version = models.ForeignKey("catalog.CodeVersion", on_delete=models.PROTECT, related_name="runs")
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # The version that was current when this run was verified: the publish is a
    # compare-and-set against it, so a publication in between is a conflict.
    expected_previous_run_id = models.CharField(max_length=40, blank=True, default="")
    output_columns = models.JSONField(default=list, blank=True)
    # When its next task was last sent: the sweeper re-sends work a broker lost.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    # Verification's own liveness: each staged -> verifying claim takes the next
    # token and beats while it checks; the sweeper hands a run whose beat stopped back
    # to `staged`, and the token fences the reclaimed verifier's late transitions.
    # NULL beat while the run waits for its second rerun (that run has its own).
    verify_token = models.PositiveIntegerField(default=0)
    verify_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # After a failed attempt, the next one may not start before this (the backoff).
    retry_at = models.DateTimeField(null=True, blank=True)
    # Failed or verification-failed, and no later run of this job and partition has
    # been published since: the failure still stands (the runs list's and the on-call
    # home's "failing"). Kept by execution.transitions.run_transition.
    failing = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(data_interval_start__lt=models.F("data_interval_end")),
                name="run_interval_ordered",
            ),
        ]
        indexes = [
            # (job, partition) lookups, and "has a later run of this partition been
            # published?" (Run.failing's upkeep) as one range seek.
            models.Index(fields=["job", "partition_key", "status", "id"], name="run_partition_status_id"),
            # The failing runs, newest first: the runs list and the on-call home read 50;
            # of some jobs (a filter, an owner's datasets). Partial: they hold only
            # those runs, and `WHERE failing` (how the ORM writes failing=True) matches
            # their condition on both backends.
            models.Index(fields=["id"], condition=models.Q(failing=True), name="run_failing_id"),
            models.Index(fields=["job", "id"], condition=models.Q(failing=True), name="run_failing_job_id"),
            models.Index(fields=["status", "id"]),
            # A job's latest published runs: whether its intervals are cheap enough to
            # bundle (execution/services/dispatch.py, bundle_size), read at dispatch.
            models.Index(fields=["job", "id"], condition=models.Q(status="published"), name="run_published_job_id"),
            models.Index(fields=["request", "status"]),
            models.Index(fields=["request", "created_at", "id"]),
            # A job's runs newest first (the runs list and API filtered by job or dataset):
            # without it a job with few runs walked every run backwards by id.
            models.Index(fields=["job", "id"], name="run_job_id"),
        ]

    def __str__(self) -> str:
        return self.run_id


class Attempt(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    attempt_no = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=AttemptStatus.choices, default=AttemptStatus.RUNNING)
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    # Failed because the warehouse refused connections (a fresh probe confirmed it):
    # the platform's fault, so not counted against the job's max_attempts.
    outage = models.BooleanField(default=False)

    class Meta:
        ordering = ["run_id", "attempt_no"]
        constraints = [models.UniqueConstraint(fields=["run", "attempt_no"], name="attempt_unique_per_run")]
        indexes = [models.Index(fields=["status", "heartbeat_at"])]

    def __str__(self) -> str:
        return f"{self.run.run_id}#{self.attempt_no}"


class CheckResult(models.Model):
    """One verification check of one run, with its numbers."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checks")
    name = models.CharField(max_length=64)
    blocking = models.BooleanField(default=True)
    passed = models.BooleanField()
    observed = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True, default="")
    checked_at = models.DateTimeField()

    class Meta:
        ordering = ["run_id", "id"]


class Delivery(models.Model):
    """The outbox of side-effect nodes. The unique idempotency key (job, partition,
    upstream version) makes a second delivery impossible, whoever asks."""

    job = models.ForeignKey("catalog.Job", on_delete=models.PROTECT, related_name="deliveries")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="deliveries")
    partition_key = models.CharField(max_length=40)
    idempotency_key = models.CharField(max_length=200, unique=True)
    channel = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    delivered_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]


class TaskOutbox(models.Model):
    """Work committed in the same transaction as the state that needs it, sent to the
    broker after commit. A crash between commit and send leaves a row the sweeper
    re-sends; a task that runs twice is harmless (tasks re-read state)."""

    task = models.CharField(max_length=100)
    args = models.JSONField(default=list)
    headers = models.JSONField(default=dict)
    queue = models.CharField(max_length=32, default="backfill")
    # Not to be delivered before this (a retry's backoff); the broker holds it until then.
    eta = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["sent_at", "id"])]


class LineageEvent(models.Model):
    """An OpenLineage event about a run, built in the transaction of the transition it
    tells of (so it exists exactly when the transition committed) and sent after commit
    (`execution/lineage_out/`). The payload is fixed when written: a resend after a crash
    is byte-identical, which a receiver deduplicates by run id, event type and time."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="lineage_events")
    event_type = models.CharField(max_length=10)
    payload = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # A sender's lease: while it lasts no other sender takes the event; a sender that
    # died leaves it to expire, and the sweeper sends the event again.
    claimed_until = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["sent_at", "id"]), models.Index(fields=["run", "id"])]

    def __str__(self) -> str:
        return f"{self.event_type} {self.run_id} ({'sent' if self.sent_at else 'unsent'})"
