from rest_framework import serializers

from backfill_portal.backfills.choices import Cascade, Strategy
from backfill_portal.backfills.models import MAX_ACTIVE_INTERVALS_LIMIT, ApprovalStep, BackfillRequest, Interval
from backfill_portal.core.text import no_control_characters

INTERVALS_INLINE = 1000


class RequestCreateSerializer(serializers.Serializer):
    """Shape and type checks only; the service checks meaning (job exists, range, limit)."""

    job = serializers.CharField(max_length=128)
    start = serializers.CharField(max_length=64, help_text="first partition, inclusive, in the dataset's timezone "
                                  "(YYYY-MM-DD daily, YYYY-MM monthly, ISO datetime with offset hourly)")
    end = serializers.CharField(max_length=64, help_text="last partition, inclusive")
    reason = serializers.CharField(allow_blank=True, max_length=4000, validators=[no_control_characters])
    cascade = serializers.ChoiceField(choices=Cascade.choices, default=Cascade.NONE)
    strategy = serializers.ChoiceField(choices=Strategy.choices, default=Strategy.FORWARD)
    max_active_intervals = serializers.IntegerField(default=4, min_value=1, max_value=MAX_ACTIVE_INTERVALS_LIMIT)
    side_effects = serializers.ListField(child=serializers.CharField(max_length=128), default=list)
    verify_twice = serializers.BooleanField(default=False)
    idempotency_key = serializers.CharField(max_length=128, required=False, allow_null=True, default=None)
    node_actions = serializers.DictField(child=serializers.CharField(max_length=16), required=False, default=dict,
                                         help_text="cascade: {downstream job: rebuild | skip}")
    exclude_stale = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(max_length=40), max_length=10000),
        required=False, default=dict,
        help_text="{depends_on_past job: [partition]}: later published partitions this request makes stale "
                  "that it should leave as they are (recorded in the audit log); any other key is refused")


class RequestPreviewSerializer(serializers.Serializer):
    """What the plan depends on; nothing is written."""

    job = serializers.CharField(max_length=128)
    start = serializers.CharField(max_length=64, help_text="first partition, inclusive")
    end = serializers.CharField(max_length=64, help_text="last partition, inclusive")
    cascade = serializers.ChoiceField(choices=Cascade.choices, default=Cascade.NONE)
    side_effects = serializers.ListField(child=serializers.CharField(max_length=128), default=list)
    exclude_stale = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(max_length=40), max_length=10000),
        required=False, default=dict, help_text="as for create: {depends_on_past job: [partition]} to leave out")


class StaleLaterSerializer(serializers.Serializer):
    job = serializers.CharField()
    after = serializers.CharField(help_text="the last partition the request republishes")
    included = serializers.ListField(child=serializers.CharField(), help_text="rebuilt in order after `after`")
    excluded = serializers.ListField(child=serializers.CharField(), help_text="left out by the requester")


class PreviewNodeSerializer(serializers.Serializer):
    job = serializers.CharField()
    layer = serializers.IntegerField()
    action = serializers.CharField()
    intervals = serializers.IntegerField()


class PreviewStepSerializer(serializers.Serializer):
    kind = serializers.CharField()
    dataset = serializers.CharField(allow_null=True)
    job = serializers.CharField(allow_null=True)
    approver = serializers.CharField(allow_null=True, help_text="null: any admin")


class RequestPreviewResultSerializer(serializers.Serializer):
    job = serializers.CharField()
    intervals = serializers.IntegerField(help_text="the target's intervals, its stale later partitions included")
    total = serializers.IntegerField(help_text="with the cascade")
    first_partition = serializers.CharField()
    last_partition = serializers.CharField()
    range_start = serializers.DateTimeField()
    range_end = serializers.DateTimeField()
    stale = StaleLaterSerializer(many=True)
    downstream = PreviewNodeSerializer(many=True)
    approval_steps = PreviewStepSerializer(many=True)
    overlaps = serializers.ListField(child=serializers.IntegerField(), help_text="active requests it overlaps")


class SubmitSerializer(serializers.Serializer):
    confirm_overlap = serializers.BooleanField(default=False)


class CommentSerializer(serializers.Serializer):
    comment = serializers.CharField(allow_blank=True, default="", max_length=4000, validators=[no_control_characters])


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(allow_blank=True, default="", max_length=4000, validators=[no_control_characters])


class IntervalSerializer(serializers.ModelSerializer):
    job = serializers.CharField(source="job.name")

    class Meta:
        model = Interval
        fields = ["position", "job", "partition_key", "start", "end", "status", "note"]


class ApprovalStepSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name", allow_null=True)
    job = serializers.CharField(source="job.name", allow_null=True)
    approver = serializers.CharField(source="approver.username", allow_null=True)
    decided_by = serializers.CharField(source="decided_by.username", allow_null=True)

    class Meta:
        model = ApprovalStep
        fields = ["id", "request", "kind", "dataset", "job", "approver", "status", "decided_by", "decided_at", "comment"]


class RequestSerializer(serializers.ModelSerializer):
    job = serializers.CharField(source="job.name")
    dataset = serializers.CharField(source="job.dataset.name")
    timezone = serializers.CharField(source="job.dataset.timezone")
    grain = serializers.CharField(source="job.dataset.grain")
    requested_by = serializers.CharField(source="requested_by.username")
    code_version = serializers.CharField(source="code_version.hash", allow_null=True)
    side_effects = serializers.SlugRelatedField(many=True, read_only=True, slug_field="name")

    class Meta:
        model = BackfillRequest
        fields = ["id", "status", "job", "dataset", "timezone", "grain", "requested_by", "requested_at", "reason",
                  "first_partition", "last_partition", "range_start", "range_end", "interval_count", "cascade",
                  "strategy", "max_active_intervals", "verify_twice", "side_effects", "paused", "code_version",
                  "submitted_at", "decided_at", "finished_at", "overlaps", "idempotency_key", "node_actions", "stale",
                  "parent"]


class RequestDetailSerializer(RequestSerializer):
    intervals = serializers.SerializerMethodField()
    intervals_truncated = serializers.SerializerMethodField()
    approval_steps = ApprovalStepSerializer(many=True, read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta(RequestSerializer.Meta):
        fields = RequestSerializer.Meta.fields + ["progress", "approval_steps", "intervals", "intervals_truncated"]

    def _limit(self) -> int | None:
        return self.context.get("intervals_limit", INTERVALS_INLINE)

    def get_intervals(self, obj) -> list[dict]:
        from backfill_portal.backfills.selectors import request_intervals

        qs = request_intervals(obj)
        limit = self._limit()
        if limit is not None:
            qs = qs[:limit]
        return IntervalSerializer(qs, many=True).data

    def get_intervals_truncated(self, obj) -> bool:
        limit = self._limit()
        return limit is not None and obj.interval_count > limit

    def get_progress(self, obj) -> dict:
        """Interval counts by status; `rolled_back`: published intervals whose version
        was rolled back since (no longer counted as `published`)."""
        from backfill_portal.backfills.selectors import request_progress
        from backfill_portal.execution.selectors import progress_with_rollbacks

        return progress_with_rollbacks(obj, request_progress(obj))
