from django.db.models import Q
from rest_framework import serializers

from backfill_portal.execution.models import Attempt, CheckResult, Run
from backfill_portal.warehouse.models import Consumption, Publication, Version


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["attempt_no", "status", "started_at", "heartbeat_at", "finished_at", "worker", "error"]


class RunSerializer(serializers.ModelSerializer):
    job = serializers.CharField(source="job.name")
    dataset = serializers.CharField(source="job.dataset.name")
    code_version = serializers.CharField(source="code_version.hash")
    request = serializers.IntegerField(source="request_id", allow_null=True)

    class Meta:
        model = Run
        fields = ["run_id", "job", "dataset", "run_type", "request", "partition_key", "data_interval_start",
                  "data_interval_end", "code_version", "status", "created_at", "started_at", "finished_at", "error"]


class CheckResultSerializer(serializers.ModelSerializer):
    class Meta:
        model = CheckResult
        fields = ["name", "blocking", "passed", "observed", "message", "checked_at"]


class ConsumptionSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name")
    version_run_id = serializers.CharField(source="version.run.run_id", allow_null=True, default=None)

    class Meta:
        model = Consumption
        fields = ["dataset", "partition_key", "version_run_id", "watermark", "pinned_at"]


class VersionSerializer(serializers.ModelSerializer):
    run_id = serializers.CharField(source="run.run_id")
    dataset = serializers.CharField(source="dataset.name")

    class Meta:
        model = Version
        fields = ["run_id", "dataset", "partition_key", "row_count", "fingerprint", "committed_attempt",
                  "committed_at", "purged_at"]


class PublicationSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name")
    run_id = serializers.CharField(source="version.run.run_id")
    previous_run_id = serializers.CharField(source="previous_version.run.run_id", allow_null=True, default=None)
    actor = serializers.CharField(source="actor.username", allow_null=True, default=None)

    class Meta:
        model = Publication
        fields = ["id", "action", "dataset", "partition_key", "run_id", "previous_run_id", "actor", "request",
                  "published_at", "reason"]


class RunDetailSerializer(RunSerializer):
    attempts = AttemptSerializer(many=True, read_only=True)
    checks = CheckResultSerializer(many=True, read_only=True)
    pinned_inputs = ConsumptionSerializer(source="consumptions", many=True, read_only=True)
    version = serializers.SerializerMethodField()
    publications = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = RunSerializer.Meta.fields + ["expected_previous_run_id", "output_columns", "attempts", "checks",
                                              "pinned_inputs", "version", "publications"]

    def get_version(self, obj) -> dict | None:
        version = Version.objects.filter(run=obj).select_related("run", "dataset").first()
        return VersionSerializer(version).data if version else None

    def get_publications(self, obj) -> list[dict]:
        """The pointer moves that made this run's version current or moved away from it
        (a publish over it, a rollback of it), newest first, as the run's page lists them."""
        pubs = (Publication.objects.filter(Q(version__run=obj) | Q(previous_version__run=obj))
                .select_related("dataset", "version__run", "previous_version__run", "actor").order_by("-id")[:50])
        return PublicationSerializer(pubs, many=True).data
