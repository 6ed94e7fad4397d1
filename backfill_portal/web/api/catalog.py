from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import api_view
from rest_framework.response import Response

from backfill_portal.core.pagination import StrictLimitOffsetPagination
from backfill_portal.web.api.serializers.catalog import DatasetSerializer, JobDetailSerializer, JobSerializer
from backfill_portal.catalog.selectors import dataset_list, job_list, lineage_expand


class CatalogPagination(StrictLimitOffsetPagination):
    default_limit = 100
    max_limit = 1000


class DatasetViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DatasetSerializer
    lookup_field = "name"
    pagination_class = CatalogPagination
    filterset_fields = ["grain", "is_source", "owner__username", "team__name"]

    def get_queryset(self):
        return dataset_list()


class JobViewSet(viewsets.ReadOnlyModelViewSet):
    lookup_field = "name"
    pagination_class = CatalogPagination
    filterset_fields = ["kind", "depends_on_past", "scheduled"]

    def get_queryset(self):
        qs = job_list()
        return qs.prefetch_related("code_versions") if self.action == "retrieve" else qs

    def get_serializer_class(self):
        return JobDetailSerializer if self.action == "retrieve" else JobSerializer


class LineageQuery(serializers.Serializer):
    root = serializers.CharField(max_length=128)
    start = serializers.CharField(required=False, help_text="first partition of the root, inclusive")
    end = serializers.CharField(required=False, help_text="last partition of the root, inclusive")


@extend_schema(parameters=[LineageQuery], responses=inline_serializer("Lineage", {
    "root": serializers.CharField(), "nodes": serializers.ListField(child=serializers.DictField())}))
@api_view(["GET"])
def lineage(request):
    """The downstream closure of a job, layered, with the partitions each node would
    rebuild when start/end are given."""
    query = LineageQuery(data=request.query_params)
    query.is_valid(raise_exception=True)
    return Response(lineage_expand(**query.validated_data))
