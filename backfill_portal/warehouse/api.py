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


# -- rollback of one partition ---------------------------------------------------------------

class _PartitionRollbackBody(serializers.Serializer):
    reason = serializers.CharField(allow_blank=True, max_length=4000)


@extend_schema(request=_PartitionRollbackBody, responses=inline_serializer("PartitionRollback", {
    "dataset": serializers.CharField(), "partition_key": serializers.CharField(),
    "from_run_id": serializers.CharField(), "to_run_id": serializers.CharField(),
    "consumers": serializers.ListField(child=serializers.DictField()), "rebuild": serializers.CharField()}))
@api_view(["POST"])
def partition_rollback_view(request, name: str, key: str):
    """Move the pointer back to the previous verified version (409 if someone published
    since, if there is none, or if it was rolled back already)."""
    from rest_framework.reverse import reverse

    from backfill_portal.warehouse.services.rollback import partition_rollback

    body = _PartitionRollbackBody(data=request.data)
    body.is_valid(raise_exception=True)
    result = partition_rollback(actor=request.user, dataset=name, partition_key=key, **body.validated_data)
    result["rebuild"] = reverse("partition-rollback-rebuild", kwargs={"name": name, "key": key}, request=request)
    return Response(result)


@extend_schema(request=None, responses={201: inline_serializer("RebuildFiled", {
    "requests": serializers.ListField(child=serializers.IntegerField())})})
@api_view(["POST"])
def partition_rollback_rebuild_view(request, name: str, key: str):
    """File a request for each consumer job that read the rolled-back version."""
    from backfill_portal.warehouse.services.rollback import partition_rollback_rebuild

    filed = partition_rollback_rebuild(actor=request.user, dataset=name, partition_key=key)
    return Response({"requests": [r.pk for r in filed]}, status=201)
