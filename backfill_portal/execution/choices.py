from django.db import models


class RunType(models.TextChoices):
    SCHEDULED = "scheduled"
    BACKFILL = "backfill"
    MANUAL = "manual"
    VERIFICATION = "verification"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    STAGED = "staged"
    VERIFYING = "verifying"
    VERIFIED = "verified"
    PUBLISHED = "published"
    FAILED = "failed"
    VERIFICATION_FAILED = "verification_failed"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"
    ROLLED_BACK = "rolled_back"


class AttemptStatus(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
