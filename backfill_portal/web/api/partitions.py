from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from backfill_portal.web.api import validated_or_refused
from backfill_portal.web.api.reconciliation import RESTORED_TAINTED_HELP, PartitionMoveSerializer
from backfill_portal.web.api.serializers.runs import PublicationSerializer, VersionSerializer
from backfill_portal.warehouse.selectors import partition_state
from backfill_portal.core.text import no_control_characters


class VersionRefSerializer(serializers.Serializer):
    dataset = serializers.CharField()
    partition_key = serializers.CharField()
    run_id = serializers.CharField()


class ContaminationSerializer(serializers.Serializer):
    """The mark of a partition built from a rolled-back input."""

    state = serializers.ChoiceField(choices=["pending", "rebuilt", "withdrawn"])
    message = serializers.CharField(help_text="built from a rolled-back input: rebuild pending / rebuilt by #N")
    run_id = serializers.CharField(help_text="the version built from the rolled-back input")
    depth = serializers.IntegerField()
    via = VersionRefSerializer()
    rolled_back = VersionRefSerializer()
    rebuild_request = serializers.IntegerField(allow_null=True)
    rebuilt_by = serializers.IntegerField(allow_null=True)
    found_at = serializers.DateTimeField()


class ImpactEntrySerializer(serializers.Serializer):
    """One entry of a rollback's contaminated closure."""

    dataset = serializers.CharField()
    partition_key = serializers.CharField()
    run_id = serializers.CharField()
    job = serializers.CharField()
    request = serializers.IntegerField(allow_null=True, help_text="the request that published this version")
    depth = serializers.IntegerField(help_text="consumption steps from the rolled-back version")
    via = VersionRefSerializer(help_text="the input version it was reached through")
    rolled_back = VersionRefSerializer()
    rebuild_request = serializers.IntegerField(allow_null=True)
    state = serializers.ChoiceField(choices=["pending", "rebuilt", "withdrawn"])
    rebuilt_by = serializers.IntegerField(allow_null=True)
    message = serializers.CharField()


@extend_schema(responses=inline_serializer("PartitionState", {
    "dataset": serializers.CharField(), "partition_key": serializers.CharField(),
    "current_run_id": serializers.CharField(allow_null=True),
    "contamination": ContaminationSerializer(allow_null=True),
    "publications": PublicationSerializer(many=True), "versions": VersionSerializer(many=True)}))
@api_view(["GET"])
def partition_detail(request, name: str, key: str):
    """The current pointer of one partition, its version history, and its mark when
    it was built from a rolled-back input (`contamination`, null otherwise)."""
    from backfill_portal.recovery.rollback import partition_contamination

    state = partition_state(dataset_name=name, partition_key=key)
    key = state["partition_key"]  # as the catalog writes it, whichever spelling was asked
    mark = None if state["dataset"].is_source else partition_contamination(dataset=state["dataset"],
                                                                            partition_key=key)
    return Response({
        "dataset": name, "partition_key": key, "current_run_id": state["current_run_id"],
        "contamination": ContaminationSerializer(mark).data if mark else None,
        "publications": PublicationSerializer(state["publications"], many=True).data,
        "versions": VersionSerializer(state["versions"], many=True).data,
    })


# -- rollback of one partition ---------------------------------------------------------------

class _PartitionRollbackBody(serializers.Serializer):
    reason = serializers.CharField(allow_blank=True, max_length=4000, validators=[no_control_characters])


@extend_schema(request=_PartitionRollbackBody, responses=inline_serializer("PartitionRollback", {
    "dataset": serializers.CharField(), "partition_key": serializers.CharField(),
    "from_run_id": serializers.CharField(), "to_run_id": serializers.CharField(),
    "consumers": serializers.ListField(child=serializers.DictField()),
    "impact": ImpactEntrySerializer(many=True),
    "restored_tainted": PartitionMoveSerializer(many=True, help_text=RESTORED_TAINTED_HELP),
    "rebuild": serializers.CharField()}))
@api_view(["POST"])
def partition_rollback_view(request, name: str, key: str):
    """Move the pointer back to the previous verified version (409 if someone published
    since, if there is none, or if it was rolled back already). `impact` is the
    contaminated closure: every published version built from the rolled-back one."""
    from rest_framework.reverse import reverse

    from backfill_portal.recovery.rollback import partition_rollback, require_partition_rollback

    body = validated_or_refused(_PartitionRollbackBody, request.data, permission=lambda: require_partition_rollback(
        actor=request.user, dataset=name, partition_key=key))
    result = partition_rollback(actor=request.user, dataset=name, partition_key=key, **body)
    result["rebuild"] = reverse("partition-rollback-rebuild", kwargs={"name": name, "key": key}, request=request)
    return Response(result)


_REBUILD_FILED = inline_serializer("RebuildFiled", {"requests": serializers.ListField(child=serializers.IntegerField())})


@extend_schema(request=None, responses={201: _REBUILD_FILED, 200: _REBUILD_FILED})
@api_view(["POST"])
def partition_rollback_rebuild_view(request, name: str, key: str):
    """File ONE request rebuilding the whole contaminated closure in layer order (201);
    asking again returns the same request (200)."""
    from backfill_portal.recovery.rollback import partition_rollback_rebuild

    filed = partition_rollback_rebuild(actor=request.user, dataset=name, partition_key=key)
    return Response({"requests": [r.pk for r in filed]}, status=201 if filed.new else 200)
