import django_filters
from rest_framework import serializers, viewsets

from backfill_portal.core.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name")

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "action", "object_type", "object_id", "request_id", "dataset",
                  "from_state", "to_state", "reason", "data", "prev_hash", "hash"]


class AuditFilter(django_filters.FilterSet):
    request = django_filters.NumberFilter(field_name="request_id")
    actor = django_filters.CharFilter(field_name="actor_name")
    action = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    dataset = django_filters.CharFilter(field_name="dataset")
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["request", "actor", "action", "dataset", "since", "until"]


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The append-only audit log. Every authenticated role may read it."""

    serializer_class = AuditEventSerializer
    filterset_class = AuditFilter
    ordering = "-id"

    def get_queryset(self):
        return AuditEvent.objects.all()
