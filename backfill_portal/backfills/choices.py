from django.db import models


class RequestStatus(models.TextChoices):
    DRAFT = "draft"
    PENDING_APPROVAL = "pending_approval"
    APPROVED = "approved"
    RUNNING = "running"
    RECONCILING = "reconciling"
    COMPLETED = "completed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"


class Cascade(models.TextChoices):
    NONE = "none", "None: repair this dataset only"
    CASCADE = "cascade", "Cascade: rebuild downstream layer by layer"
    HANDOFF = "handoff", "Hand-off: downstream owners decide"


class Strategy(models.TextChoices):
    FORWARD = "forward", "Forward (oldest first)"
    BACKWARD = "backward", "Backward (newest first)"
    PARALLEL = "parallel", "Parallel"


class IntervalStatus(models.TextChoices):
    PLANNED = "planned"
    QUEUED = "queued"
    RUNNING = "running"
    PUBLISHED = "published"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class StepKind(models.TextChoices):
    OWNER = "owner", "Target dataset owner"
    DOWNSTREAM = "downstream", "Downstream dataset owner"
    SIDE_EFFECT = "side_effect", "Side-effect authorisation"
    ADMIN = "admin", "Size approval (admin)"


class StepStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
