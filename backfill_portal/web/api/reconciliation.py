"""Serializers and the CSV renderer for reconciliation, sign-off and rollback."""
from __future__ import annotations

import io

from rest_framework import renderers, serializers

from backfill_portal.backfills.models import Reconciliation, ReconciliationRow, Verdict
from backfill_portal.core.csv_export import csv_writer
from backfill_portal.core.filters import refuse_unknown_parameters
from backfill_portal.core.text import no_control_characters


class ReconciliationRowSerializer(serializers.ModelSerializer):
    job = serializers.CharField(source="job.name")
    dataset = serializers.CharField(source="dataset.name")
    status = serializers.CharField(source="verdict")
    explained_by = serializers.CharField(source="explained_by.username", allow_null=True, default=None)

    class Meta:
        model = ReconciliationRow
        fields = ["job", "dataset", "partition_key", "position", "interval_status", "status", "deviations",
                  "recomputed", "before_run_id", "after_run_id", "rows_before", "rows_after", "rows_baseline",
                  "distinct_keys", "null_keys", "measure_before", "measure_after", "measure_source",
                  "downstream_dataset", "downstream_partition", "downstream_run_id", "downstream_value",
                  "downstream_reads_after", "explanation", "explained_by", "explained_at", "computed_at"]


ROWS_LIMIT_MAX = 5000


class ReconciliationRowsQuerySerializer(serializers.Serializer):
    """Which of the rows a reconciliation's answer carries: all of them by default (as
    the CSV export needs), or one verdict's, a page at a time (`limit`, `offset`)."""

    verdict = serializers.ChoiceField(choices=Verdict.choices, required=False,
                                      help_text="only the rows of this verdict (e.g. `unexplained`: what is "
                                                "left to explain before the sign-off)")
    limit = serializers.IntegerField(min_value=1, max_value=ROWS_LIMIT_MAX, required=False,
                                     help_text=f"at most this many rows (1–{ROWS_LIMIT_MAX}); `next` then names "
                                               "the following page")
    offset = serializers.IntegerField(min_value=0, max_value=10**9, default=0,
                                      help_text="rows to skip, in (job, position) order")

    def validate(self, attrs):
        """As a list does: `?verdct=unexplained` must not answer every row."""
        refuse_unknown_parameters(self.initial_data, {*self.fields, "format"}, what="this call")
        return attrs


def rows_page(reconciliation: Reconciliation, *, request, verdict: str = "", limit: int | None = None,
              offset: int = 0) -> dict:
    """{"rows": the page's rows, "total": how many match, "next": the next page's
    address or None}."""
    from backfill_portal.recovery.reconciliation import reconciliation_rows

    rows = reconciliation_rows(reconciliation, verdict=verdict)
    if limit is None and not offset:
        rows = list(rows)
        return {"rows": rows, "total": len(rows), "next": None}
    total = rows.count()
    end = offset + limit if limit is not None else total
    following = None
    if end < total:
        query = request.query_params.copy()
        query["offset"] = str(end)
        following = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
    return {"rows": list(rows[offset:end]), "total": total, "next": following}


class ReconciliationSerializer(serializers.ModelSerializer):
    """A request's reconciliation, with the rows of the context's `rows_page` (above)."""

    request = serializers.IntegerField(source="request_id")
    request_status = serializers.CharField(source="request.status")
    signed_off_by = serializers.CharField(source="signed_off_by.username", allow_null=True, default=None)
    manifest = serializers.SerializerMethodField()
    rows_total = serializers.SerializerMethodField(help_text="rows matching `verdict` (all rows without it)")
    next = serializers.SerializerMethodField(help_text="the next page of rows (with `limit`), or null")
    rows = serializers.SerializerMethodField()

    class Meta:
        model = Reconciliation
        fields = ["request", "request_status", "computed_at", "signed_off_by", "signed_off_at", "signoff_comment",
                  "manifest", "rows_total", "next", "rows"]

    def get_rows_total(self, obj) -> int:
        return self.context["rows_page"]["total"]

    def get_next(self, obj) -> str | None:
        return self.context["rows_page"]["next"]

    def get_manifest(self, obj) -> dict:
        """The stored manifest; what a rollback changed read now, so a rollback after the
        sign-off (which freezes the numbers) is still named."""
        from backfill_portal.recovery.reconciliation import manifest_now

        return manifest_now(obj.request, obj.manifest)

    def get_rows(self, obj) -> list[dict]:
        return ReconciliationRowSerializer(self.context["rows_page"]["rows"], many=True).data


class ExplainSerializer(serializers.Serializer):
    explanation = serializers.CharField(allow_blank=True, max_length=4000, validators=[no_control_characters])
    job = serializers.CharField(max_length=128, required=False, allow_null=True, default=None,
                                help_text="only for a cascade request whose jobs share the partition key")


class SignoffSerializer(serializers.Serializer):
    comment = serializers.CharField(allow_blank=True, default="", max_length=4000, validators=[no_control_characters])


class RollbackSerializer(serializers.Serializer):
    reason = serializers.CharField(allow_blank=True, max_length=4000, validators=[no_control_characters])


class ConsumerSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    job = serializers.CharField()
    dataset = serializers.CharField()
    partition_key = serializers.CharField()
    status = serializers.CharField()
    run_type = serializers.CharField()
    request = serializers.IntegerField(allow_null=True)
    read = serializers.ListField(child=serializers.DictField())


class PartitionMoveSerializer(serializers.Serializer):
    dataset = serializers.CharField()
    partition_key = serializers.CharField()
    from_run_id = serializers.CharField()
    to_run_id = serializers.CharField()


RESTORED_TAINTED_HELP = ("the moves whose restored version was itself built from a rolled-back input (rolling "
                         "back a rebuild restores what it replaced): readers see it again, marked, until a new "
                         "rebuild is filed")
IMPACT_HELP = ("the contaminated closure: every version published at the rollback that was built from a "
               "rolled-back one, with depth, via and state")


class RequestRollbackResultSerializer(serializers.Serializer):
    """POST: the pointer moves; the GET's answer is RequestRollbackStateSerializer."""

    request = serializers.IntegerField()
    partitions = PartitionMoveSerializer(many=True, help_text="the pointer moves")
    consumers = ConsumerSerializer(many=True)
    impact = serializers.ListField(child=serializers.DictField(), help_text=IMPACT_HELP)
    restored_tainted = PartitionMoveSerializer(many=True, help_text=RESTORED_TAINTED_HELP)
    rebuild = serializers.CharField(help_text="POST here to file the one request rebuilding the closure")


class RolledBackVersionSerializer(serializers.Serializer):
    dataset = serializers.CharField()
    partition_key = serializers.CharField()
    run_id = serializers.CharField()


class RequestRollbackStateSerializer(serializers.Serializer):
    """GET: what the request's rollback did (nothing yet: empty lists), not a move list."""

    request = serializers.IntegerField()
    status = serializers.CharField(help_text="the request's status")
    rolled_back = RolledBackVersionSerializer(many=True, help_text="the versions this request published that "
                                              "were rolled back")
    consumers = ConsumerSerializer(many=True)
    impact = serializers.ListField(child=serializers.DictField(), help_text=IMPACT_HELP)
    rebuild = serializers.CharField(help_text="POST here to file the one request rebuilding the closure")


# -- CSV ----------------------------------------------------------------------------------

CSV_COLUMNS = ["job", "dataset", "partition_key", "interval_status", "status", "recomputed", "deviations",
               "rows_before", "rows_after", "rows_baseline", "distinct_keys", "null_keys", "measure_before",
               "measure_after", "measure_source", "downstream_dataset", "downstream_partition", "downstream_value",
               "downstream_reads_after", "explanation", "explained_by", "explained_at", "before_run_id",
               "after_run_id"]


def _cell(value):
    """A list as one cell; the writer neutralises formulas in every cell."""
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    return value


class ReconciliationCSVRenderer(renderers.BaseRenderer):
    """The table, then the manifest (counts, then one line per exception), in one file,
    through the export writer (user text such as explanations cannot become a formula)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        writer = csv_writer(out)
        if not isinstance(data, dict) or "rows" not in data:
            writer.writerow(["detail"])
            writer.writerow([_cell((data or {}).get("detail", data) if isinstance(data, dict) else data)])
            return out.getvalue().encode(self.charset)
        writer.writerow(CSV_COLUMNS)
        for row in data["rows"]:
            writer.writerow([_cell(row.get(c)) for c in CSV_COLUMNS])
        manifest = data.get("manifest") or {}
        writer.writerow([])
        writer.writerow(["manifest", "value"])
        writer.writerow(["request", data.get("request")])
        # Whose numbers these are: the request's state, when they were computed, and the
        # sign-off that made them final (the page shows it; the export left it out).
        for key in ("request_status", "computed_at", "signed_off_by", "signed_off_at", "signoff_comment"):
            writer.writerow([key, _cell(data.get(key))])
        for key in ("intervals_planned", "runs_created", "verification_runs", "versions_published", "versions_current",
                    "versions_rolled_back", "recomputed"):
            writer.writerow([key, _cell(manifest.get(key))])
        for key, value in (manifest.get("verdicts") or {}).items():
            writer.writerow([f"intervals_{key}", value])
        writer.writerow([])
        writer.writerow(["exception", "dataset_or_job", "partition_key", "detail"])
        for name, items in (manifest.get("exceptions") or {}).items():
            for item in items:
                if not isinstance(item, dict):
                    writer.writerow([name, "", item, ""])
                    continue
                detail = {k: v for k, v in item.items() if k not in ("dataset", "job", "partition_key")}
                writer.writerow([name, item.get("dataset") or item.get("job", ""), item.get("partition_key", ""),
                                 "; ".join(f"{k}={'' if v is None else _cell(v)}" for k, v in detail.items())])
        return out.getvalue().encode(self.charset)
