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

# How many intervals of one request may be in flight at once (the form, the API and the
# service all check this one bound).
MAX_ACTIVE_INTERVALS_LIMIT = 64


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
    max_active_intervals = models.PositiveIntegerField(default=4)  # 1..MAX_ACTIVE_INTERVALS_LIMIT
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
    stale = models.JSONField(
        default=dict, blank=True,
        help_text="depends_on_past jobs whose later published partitions this request makes stale: "
                  "{job: {after, included: [partition], excluded: [partition]}}; excluded ones are left as they are")
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


class Reconciliation(models.Model):
    """A request's reconciliation: the manifest, when it was computed and who signed it off.
    The per-interval numbers are ReconciliationRow; "done" means signed off here."""

    request = models.OneToOneField(BackfillRequest, on_delete=models.CASCADE, related_name="reconciliation")
    computed_at = models.DateTimeField()
    manifest = models.JSONField(default=dict, blank=True)
    signed_off_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="+")
    signed_off_at = models.DateTimeField(null=True, blank=True)
    signoff_comment = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"reconciliation of request #{self.request_id}"


class Verdict(models.TextChoices):
    MATCHED = "matched"
    EXPLAINED = "explained"
    UNEXPLAINED = "unexplained"
    # Not run on purpose (a side-effect node not authorised, a node the requester
    # skipped, an interval cancelled with its request): nothing was compared, so it is
    # neither matched nor waiting for a word.
    SKIPPED = "skipped"


class ReconciliationRow(models.Model):
    """The four numbers of one interval of a request, side by side.

    `verdict` is derived (deviations + explanation) each time the row is computed or
    explained; it is a classification, not a lifecycle, so it has no transitions map.
    """

    request = models.ForeignKey(BackfillRequest, on_delete=models.CASCADE, related_name="reconciliation_rows")
    interval = models.ForeignKey(Interval, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey("catalog.Job", on_delete=models.PROTECT, related_name="+")
    dataset = models.ForeignKey("catalog.Dataset", on_delete=models.PROTECT, related_name="+")
    position = models.PositiveIntegerField()
    partition_key = models.CharField(max_length=40)
    interval_status = models.CharField(max_length=12)
    before_run_id = models.CharField(max_length=40, blank=True, default="")
    after_run_id = models.CharField(max_length=40, blank=True, default="")
    # 1. rows: before (current at submission), after (this request's version), baseline
    rows_before = models.BigIntegerField(null=True, blank=True)
    rows_after = models.BigIntegerField(null=True, blank=True)
    rows_baseline = models.FloatField(null=True, blank=True)
    # 2. business keys
    distinct_keys = models.BigIntegerField(null=True, blank=True)
    null_keys = models.BigIntegerField(null=True, blank=True)
    # 3. core measure vs source
    measure_before = models.FloatField(null=True, blank=True)
    measure_after = models.FloatField(null=True, blank=True)
    measure_source = models.FloatField(null=True, blank=True)
    # 4. what the nearest downstream dataset shows now
    downstream_dataset = models.CharField(max_length=128, blank=True, default="")
    downstream_partition = models.CharField(max_length=40, blank=True, default="")
    downstream_run_id = models.CharField(max_length=40, blank=True, default="")
    downstream_value = models.FloatField(null=True, blank=True)
    downstream_reads_after = models.BooleanField(null=True, blank=True)
    recomputed = models.BooleanField(default=False, help_text="recomputed against current (changed) upstream")
    deviations = models.JSONField(default=list, blank=True)
    verdict = models.CharField(max_length=12, choices=Verdict.choices)
    explanation = models.TextField(blank=True, default="")
    explained_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                     related_name="+")
    explained_at = models.DateTimeField(null=True, blank=True)
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["request_id", "job_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["request", "interval"], name="reconciliation_row_once_per_interval"),
        ]
        indexes = [
            models.Index(fields=["request", "verdict"]),
            models.Index(fields=["request", "partition_key"]),
        ]

    def __str__(self) -> str:
        return f"request #{self.request_id} {self.partition_key}: {self.verdict}"
