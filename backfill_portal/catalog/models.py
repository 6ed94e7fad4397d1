"""The catalog: teams, data-source pools, datasets, jobs, lineage and code versions.
Declared in a YAML file and synced by `manage.py sync_catalog` (services/sync.py)."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from backfill_portal.catalog.choices import Grain, JobKind


class Team(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    max_concurrent_runs = models.PositiveIntegerField(default=16)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Pool(models.Model):
    """A data source's slot pool. Some slots are reserved for scheduled production runs."""

    name = models.SlugField(max_length=64, unique=True)
    slots = models.PositiveIntegerField(default=8)
    reserved_for_production = models.PositiveIntegerField(default=2)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(reserved_for_production__lte=models.F("slots")),
                name="pool_reserved_within_slots",
            )
        ]

    def __str__(self) -> str:
        return self.name


class Dataset(models.Model):
    name = models.SlugField(max_length=128, unique=True)
    description = models.TextField(blank=True, default="")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="owned_datasets")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="datasets")
    timezone = models.CharField(max_length=64, default="UTC")
    grain = models.CharField(max_length=8, choices=Grain.choices, default=Grain.DAY)
    business_key = models.JSONField(default=list, help_text="unique key columns")
    core_measure = models.CharField(max_length=64, blank=True, default="")
    columns = models.JSONField(default=list, help_text='[{"name": ..., "type": ...}]')
    is_source = models.BooleanField(default=False)
    time_column = models.CharField(max_length=64, blank=True, default="", help_text="sources: the column cut by the data interval")
    partition_column = models.CharField(
        max_length=64, blank=True, default="",
        help_text="a declared text column holding the partition key in every row, what readers filter on; "
                  "empty: the bookkeeping column _partition",
    )
    indexes = models.JSONField(default=list, blank=True,
                               help_text="indexes created on every version, each a list of column names")
    reader_layout = models.CharField(
        max_length=16, blank=True, default="", choices=[("partitioned", "partitioned"), ("table", "table")],
        help_text="how a warehouse that can choose (PostgreSQL) shows the dataset to readers: each published "
                  "version attached as a partition, or one table whose partition a publish replaces; "
                  "empty: a table for an hourly dataset, else the warehouse's default",
    )
    tolerances = models.JSONField(default=dict, blank=True)
    checks = models.JSONField(default=list, blank=True, help_text="custom SQL assertions: rows returned = failure")
    source_measure_sql = models.TextField(
        blank=True, default="",
        help_text="a template returning one number: the core measure expected from the upstream for the interval",
    )
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def column_names(self) -> list[str]:
        return [c["name"] for c in self.columns]


class Job(models.Model):
    name = models.SlugField(max_length=128, unique=True)
    description = models.TextField(blank=True, default="")
    dataset = models.OneToOneField(Dataset, on_delete=models.PROTECT, related_name="job")
    upstreams = models.ManyToManyField(Dataset, related_name="consumers", blank=True)
    kind = models.CharField(max_length=16, choices=JobKind.choices, default=JobKind.SQL)
    depends_on_past = models.BooleanField(default=False)
    has_side_effects = models.BooleanField(default=False)
    max_concurrent_runs = models.PositiveIntegerField(default=4)
    max_attempts = models.PositiveIntegerField(default=3)
    heartbeat_timeout_seconds = models.PositiveIntegerField(default=60)
    scheduled = models.BooleanField(default=False, help_text="the scheduler creates a production run per closed interval")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="jobs")
    definition = models.JSONField(default=dict, help_text="sql / callable / target, and params")
    current_code_version = models.ForeignKey(
        "CodeVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class CodeVersion(models.Model):
    """A content hash of a job's definition (template, params, upstreams). Old ones are kept."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="code_versions")
    hash = models.CharField(max_length=64)
    definition = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["job", "hash"], name="code_version_unique_per_job")]

    def __str__(self) -> str:
        return f"{self.job.name}@{self.short_hash}"

    @property
    def short_hash(self) -> str:
        return self.hash[:12]
