"""Backfill requests, their frozen interval plan, and approval steps."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from backfill_portal.backfills.choices import (
    Cascade,
    IntervalStatus,
    RequestStatus,
    StepKind,
    StepStatus,
    Strategy,
)


class BackfillRequest(models.Model):
    job = models.ForeignKey("catalog.Job", on_delete=models.PROTECT, related_name="backfill_requests")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="backfill_requests")
    requested_at = models.DateTimeField()
    reason = models.TextField()
    first_partition = models.CharField(max_length=40)
    last_partition = models.CharField(max_length=40)
    # The UTC span of the whole plan: two contiguous plans on one job overlap iff their spans do.
    range_start = models.DateTimeField()
    range_end = models.DateTimeField()
    interval_count = models.PositiveIntegerField(default=0)
    cascade = models.CharField(max_length=8, choices=Cascade.choices, default=Cascade.NONE)
    strategy = models.CharField(max_length=8, choices=Strategy.choices, default=Strategy.FORWARD)
    max_active_intervals = models.PositiveIntegerField(default=4)
    verify_twice = models.BooleanField(default=False)
    side_effects = models.ManyToManyField("catalog.Job", blank=True, related_name="authorising_requests")
    status = models.CharField(max_length=20, choices=RequestStatus.choices, default=RequestStatus.DRAFT)
    paused = models.BooleanField(default=False)
    code_version = models.ForeignKey(
        "catalog.CodeVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="frozen at submission",
    )
    submitted_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    overlaps = models.JSONField(default=list, blank=True, help_text="ids of active requests this one overlapped at submission")
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)
    node_actions = models.JSONField(default=dict, blank=True,
                                    help_text="cascade plan: {job: rebuild | skip | handoff} for each downstream job")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children",
                               help_text="the request whose hand-off or rollback filed this one")
    payload_hash = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(range_start__lt=models.F("range_end")), name="request_range_ordered"),
            models.UniqueConstraint(
                fields=["requested_by", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="request_idempotency_key_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "id"]),
            models.Index(fields=["requested_by", "id"]),
            models.Index(fields=["job", "status", "range_start"]),
        ]

    def __str__(self) -> str:
        return f"request #{self.pk} {self.job.name} {self.first_partition}..{self.last_partition}"


class Interval(models.Model):
    """One frozen data interval of one job in a request."""

    request = models.ForeignKey(BackfillRequest, on_delete=models.CASCADE, related_name="intervals")
    job = models.ForeignKey("catalog.Job", on_delete=models.PROTECT, related_name="+")
    position = models.PositiveIntegerField(help_text="order in time, 0 = oldest")
    partition_key = models.CharField(max_length=40)
    start = models.DateTimeField()
    end = models.DateTimeField()
    status = models.CharField(max_length=12, choices=IntervalStatus.choices, default=IntervalStatus.PLANNED)
    code_version = models.ForeignKey("catalog.CodeVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    note = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["request_id", "job_id", "position"]
        constraints = [
            models.CheckConstraint(condition=models.Q(start__lt=models.F("end")), name="interval_start_before_end"),
            models.UniqueConstraint(fields=["request", "job", "partition_key"], name="interval_unique_per_request_job"),
        ]
        indexes = [
            models.Index(fields=["request", "status"]),
            models.Index(fields=["job", "start"]),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}:{self.partition_key}"


class ApprovalStep(models.Model):
    request = models.ForeignKey(BackfillRequest, on_delete=models.CASCADE, related_name="approval_steps")
    kind = models.CharField(max_length=12, choices=StepKind.choices)
    dataset = models.ForeignKey("catalog.Dataset", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    job = models.ForeignKey("catalog.Job", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="approval_steps",
        help_text="who may decide; empty for admin steps (any admin)",
    )
    status = models.CharField(max_length=10, choices=StepStatus.choices, default=StepStatus.PENDING)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["request_id", "id"]
        indexes = [models.Index(fields=["approver", "status"])]

    def __str__(self) -> str:
        return f"step #{self.pk} {self.kind} for request #{self.request_id}"


class HandoffItem(models.Model):
    """Hand-off cascade: after the target publishes, each downstream owner decides
    within a window whether to rebuild (accept files a linked cascade request)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        ACCEPTED = "accepted"
        DECLINED = "declined"
        EXPIRED = "expired"

    request = models.ForeignKey(BackfillRequest, on_delete=models.CASCADE, related_name="handoffs")
    job = models.ForeignKey("catalog.Job", on_delete=models.PROTECT, related_name="+")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="handoffs")
    first_partition = models.CharField(max_length=40)
    last_partition = models.CharField(max_length=40)
    deadline = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    follow_up = models.ForeignKey(BackfillRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["owner", "status"]), models.Index(fields=["status", "deadline"])]
        constraints = [models.UniqueConstraint(fields=["request", "job"], name="handoff_once_per_job")]
