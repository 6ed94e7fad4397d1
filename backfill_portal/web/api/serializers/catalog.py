from rest_framework import serializers

from backfill_portal.catalog.models import CodeVersion, Dataset, Job


class DatasetSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.name")
    produced_by = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = ["name", "description", "owner", "team", "timezone", "grain", "business_key", "core_measure",
                  "columns", "is_source", "time_column", "partition_column", "indexes", "reader_layout", "tolerances", "checks", "produced_by", "updated_at"]

    def get_produced_by(self, obj) -> str | None:
        job = getattr(obj, "job", None) if hasattr(obj, "job") else None
        return job.name if job else None


class CodeVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = CodeVersion
        fields = ["hash", "created_at", "definition"]


class JobSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name")
    owner = serializers.CharField(source="dataset.owner.username")
    upstreams = serializers.SlugRelatedField(many=True, read_only=True, slug_field="name")
    pool = serializers.CharField(source="pool.name")
    code_version = serializers.CharField(source="current_code_version.hash", allow_null=True)

    class Meta:
        model = Job
        fields = ["name", "description", "dataset", "owner", "upstreams", "kind", "depends_on_past",
                  "has_side_effects", "max_concurrent_runs", "max_attempts", "heartbeat_timeout_seconds",
                  "scheduled", "pool", "code_version", "definition", "updated_at"]


class JobDetailSerializer(JobSerializer):
    code_versions = CodeVersionSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = JobSerializer.Meta.fields + ["code_versions"]
