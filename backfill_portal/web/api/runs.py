import django_filters
from rest_framework import viewsets

from backfill_portal.core.filters import PortalFilterSet
from backfill_portal.execution.models import Run
from backfill_portal.web.api.serializers.runs import RunDetailSerializer, RunSerializer
from backfill_portal.execution.selectors import run_list


class RunFilter(PortalFilterSet):
    """As the runs page filters: by the dataset a run writes too (a job's name is not
    the dataset's when a dbt model or a renamed job produces it)."""

    dataset = django_filters.CharFilter(field_name="job__dataset__name", help_text="the dataset the run writes")

    class Meta:
        model = Run
        fields = ["status", "run_type", "job__name", "request", "partition_key", "dataset"]


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    lookup_field = "run_id"
    filterset_class = RunFilter
    ordering = "-id"

    def get_queryset(self):
        qs = run_list()
        if self.action == "retrieve":
            return qs.prefetch_related("attempts", "checks", "consumptions__dataset", "consumptions__version__run")
        return qs

    def get_serializer_class(self):
        return RunDetailSerializer if self.action == "retrieve" else RunSerializer
