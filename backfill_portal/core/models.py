"""The audit log: append-only and chained (each event carries the HMAC of itself and
the one before it, under a key the database never holds, so an edit behind the
application's back breaks the chain and cannot be re-signed)."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class AppendOnlyError(Exception):
    pass


class AuditEventQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AppendOnlyError("the audit log is append-only: updates are refused")

    def delete(self):
        raise AppendOnlyError("the audit log is append-only: deletes are refused")

    def bulk_create(self, objs, *args, **kwargs):
        raise AppendOnlyError(WRITTEN_BY_AUDIT_RECORD)

    def create(self, **kwargs):
        raise AppendOnlyError(WRITTEN_BY_AUDIT_RECORD)


# The chain gives each event its id and signature under its lock; an event written any
# other way would take an id from the table's sequence, which the chain does not use.
WRITTEN_BY_AUDIT_RECORD = ("audit events are written by core.services.audit.audit_record, which numbers, "
                           "chains and signs them")


class AuditEvent(models.Model):
    at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=32)
    object_id = models.CharField(max_length=255)
    request_id = models.BigIntegerField(null=True, blank=True)
    dataset = models.CharField(max_length=128, blank=True, default="")
    from_state = models.CharField(max_length=32, blank=True, default="")
    to_state = models.CharField(max_length=32, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)
    # The id of the AUDIT_KEY whose HMAC `hash` is; empty for the events written before
    # the chain was keyed (plain SHA-256, accepted only as the chain's first events).
    key_id = models.CharField(max_length=32, blank=True, default="")

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["request_id", "id"]),
            models.Index(fields=["actor_name", "id"]),
            models.Index(fields=["action", "id"]),
            # "Action starts with" (LIKE 'x%') on PostgreSQL, whose database collation keeps
            # the plain index out of a prefix match (opclasses are ignored elsewhere).
            models.Index(fields=["action"], opclasses=["varchar_pattern_ops"], name="audit_action_prefix"),
            models.Index(fields=["dataset", "id"]),
            models.Index(fields=["object_type", "object_id"]),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.object_type}:{self.object_id}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise AppendOnlyError("the audit log is append-only: updates are refused")
        raise AppendOnlyError(WRITTEN_BY_AUDIT_RECORD)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("the audit log is append-only: deletes are refused")


class ApiToken(models.Model):
    """A bearer token for the API. Only a SHA-256 of the key is kept: the key itself is
    shown once, when it is issued. Every token expires; a revoked one stays as a record."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    label = models.CharField(max_length=100, blank=True, default="")
    key_hash = models.CharField(max_length=64, unique=True)
    # The first characters of the key, so a user can tell their tokens apart.
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["user", "id"])]
        constraints = [
            models.CheckConstraint(condition=models.Q(expires_at__gt=models.F("created_at")),
                                   name="core_apitoken_expires_after_created"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user_id}, until {self.expires_at:%Y-%m-%d})"
