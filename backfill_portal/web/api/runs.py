from rest_framework import viewsets

from backfill_portal.web.api.serializers.runs import RunDetailSerializer, RunSerializer
from backfill_portal.execution.selectors import run_list


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    lookup_field = "run_id"
    filterset_fields = ["status", "run_type", "job__name", "request", "partition_key"]
    ordering = "-id"

    def get_queryset(self):
        qs = run_list()
        if self.action == "retrieve":
            return qs.prefetch_related("attempts", "checks", "consumptions__dataset", "consumptions__version__run")
        return qs

    def get_serializer_class(self):
        return RunDetailSerializer if self.action == "retrieve" else RunSerializer
