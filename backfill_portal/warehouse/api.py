from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from backfill_portal.execution.api.serializers import PublicationSerializer, VersionSerializer
from backfill_portal.warehouse.selectors import partition_state


@extend_schema(responses=inline_serializer("PartitionState", {
    "dataset": serializers.CharField(), "partition_key": serializers.CharField(),
    "current_run_id": serializers.CharField(allow_null=True),
    "publications": PublicationSerializer(many=True), "versions": VersionSerializer(many=True)}))
@api_view(["GET"])
def partition_detail(request, name: str, key: str):
    """The current pointer of one partition and its version history."""
    state = partition_state(dataset_name=name, partition_key=key)
    return Response({
        "dataset": name, "partition_key": key, "current_run_id": state["current_run_id"],
        "publications": PublicationSerializer(state["publications"], many=True).data,
        "versions": VersionSerializer(state["versions"], many=True).data,
    })
