"""The metadata mirror of the warehouse: versions, publications and consumption.

The warehouse itself holds the truth for visibility (the current pointer); these
rows record who published what, when, replacing which version, and who read it.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Version(models.Model):
    """The isolated output of one run for one partition."""

    run = models.OneToOneField("execution.Run", on_delete=models.PROTECT, related_name="version")
    dataset = models.ForeignKey("catalog.Dataset", on_delete=models.PROTECT, related_name="versions")
    partition_key = models.CharField(max_length=40)
    row_count = models.BigIntegerField()
    fingerprint = models.CharField(max_length=64)
    committed_attempt = models.PositiveIntegerField()
    committed_at = models.DateTimeField()
    purged_at = models.DateTimeField(null=True, blank=True)
    # When staged: the median row count of the (up to BASELINE_WINDOW) published
    # partitions before this one, and row_count / that median once the window holds at
    # least three of them (execution/anomalies.py). Set with the row, never changed.
    baseline_rows = models.FloatField(null=True, blank=True)
    row_ratio = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["dataset", "partition_key", "id"]),
                   # The home's anomalies: a range scan per dataset outside its row band.
                   models.Index(fields=["dataset", "row_ratio"], name="version_row_ratio",
                                condition=models.Q(row_ratio__isnull=False))]

    def __str__(self) -> str:
        return f"{self.dataset.name}/{self.partition_key}@{self.run.run_id}"


class Publication(models.Model):
    """One move of the current pointer of (dataset, partition): a publish or a rollback."""

    class Action(models.TextChoices):
        PUBLISH = "publish"
        ROLLBACK = "rollback"

    dataset = models.ForeignKey("catalog.Dataset", on_delete=models.PROTECT, related_name="publications")
    partition_key = models.CharField(max_length=40)
    version = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="publications")
    previous_version = models.ForeignKey(Version, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=8, choices=Action.choices, default=Action.PUBLISH)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    request = models.ForeignKey("backfills.BackfillRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="publications")
    published_at = models.DateTimeField()
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["dataset", "partition_key", "id"]), models.Index(fields=["request", "id"]),
                   # What moved since a reconciliation was computed (recovery.reconciliation._stale).
                   models.Index(fields=["published_at"])]

    def __str__(self) -> str:
        return f"{self.action} {self.dataset.name}/{self.partition_key} -> {self.version.run.run_id}"


class Consumption(models.Model):
    """Run R read version V of (dataset, partition), pinned at run start.
    For a source (not versioned) the input watermark is recorded instead of a version."""

    run = models.ForeignKey("execution.Run", on_delete=models.CASCADE, related_name="consumptions")
    dataset = models.ForeignKey("catalog.Dataset", on_delete=models.PROTECT, related_name="+")
    partition_key = models.CharField(max_length=40)
    version = models.ForeignKey(Version, null=True, blank=True, on_delete=models.PROTECT, related_name="consumers")
    watermark = models.JSONField(default=dict, blank=True)
    pinned_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["run", "dataset", "partition_key"], name="consumption_once_per_input")]
        indexes = [models.Index(fields=["dataset", "partition_key"])]


class Contamination(models.Model):
    """One entry of a rollback's contaminated closure: a version that was published when
    `rollback` withdrew `rolled_back`, and whose pinned inputs include that version,
    directly (depth 1) or through other versions (`via` is the input it was reached
    through, `depth` the number of consumption steps). Recorded in the rollback's
    transaction; it stays as history after the partition is rebuilt."""

    rollback = models.ForeignKey(Publication, on_delete=models.PROTECT, related_name="contaminations")
    rolled_back = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="+")
    version = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="contaminations")
    dataset = models.ForeignKey("catalog.Dataset", on_delete=models.PROTECT, related_name="+")
    partition_key = models.CharField(max_length=40)
    depth = models.PositiveIntegerField()
    via = models.ForeignKey(Version, on_delete=models.PROTECT, related_name="+")
    rebuild = models.ForeignKey("backfills.BackfillRequest", null=True, blank=True, on_delete=models.PROTECT,
                                related_name="+", help_text="the one request filed to rebuild the closure")
    found_at = models.DateTimeField()

    class Meta:
        ordering = ["depth", "id"]
        constraints = [models.UniqueConstraint(fields=["rollback", "version"], name="contamination_once_per_rollback")]
        indexes = [models.Index(fields=["dataset", "partition_key"])]

    def __str__(self) -> str:
        return f"{self.dataset.name}/{self.partition_key} built from rolled-back {self.rolled_back_id} (depth {self.depth})"


class WarehouseOutage(models.Model):
    """A time the warehouse refused connections (a fresh probe confirmed it). While one
    is open no attempt starts and nothing is dispatched; the periodic probe closes it
    once a connection succeeds, and the work waiting for it is sent again."""

    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    last_probe_at = models.DateTimeField(null=True, blank=True)
    probes = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        constraints = [
            # One open outage at a time: two workers that find the warehouse down together
            # record one outage, not two.
            models.UniqueConstraint(fields=["status"], condition=models.Q(status="open"), name="one_open_warehouse_outage"),
        ]

    def __str__(self) -> str:
        return f"warehouse outage since {self.started_at.isoformat()} ({self.status})"
