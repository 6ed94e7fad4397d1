from rest_framework import serializers

from backfill_portal.execution.models import Attempt, Run


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


class RunDetailSerializer(RunSerializer):
    attempts = AttemptSerializer(many=True, read_only=True)

    class Meta(RunSerializer.Meta):
        fields = RunSerializer.Meta.fields + ["attempts"]
