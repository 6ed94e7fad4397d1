from rest_framework import viewsets
from rest_framework.pagination import LimitOffsetPagination

from backfill_portal.catalog.api.serializers import DatasetSerializer, JobDetailSerializer, JobSerializer
from backfill_portal.catalog.selectors import dataset_list, job_list


class CatalogPagination(LimitOffsetPagination):
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
