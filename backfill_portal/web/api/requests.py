"""Thin API views: parse, call one service, serialise."""
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from backfill_portal.web.api import validated_or_refused
from backfill_portal.web.api.serializers.requests import (
    CommentSerializer,
    ReasonSerializer,
    RequestCreateSerializer,
    RequestDetailSerializer,
    RequestPreviewResultSerializer,
    RequestPreviewSerializer,
    RequestSerializer,
    SubmitSerializer,
)
from backfill_portal.backfills import policy
from backfill_portal.backfills.preview import request_plan_preview
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ValidationError
from backfill_portal.backfills.selectors import request_list
from backfill_portal.core.api import ID_LOOKUP
from backfill_portal.core.filters import flag_parameter, query_flag
from backfill_portal.core.schema import error_responses
from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
    request_get,
)
from backfill_portal.backfills.services.lifecycle import request_pause, request_resume
from backfill_portal.execution.services.dispatch import request_retry_failed
from backfill_portal.web.api.reconciliation import (
    ExplainSerializer,
    ReconciliationCSVRenderer,
    ReconciliationRowSerializer,
    ReconciliationRowsQuerySerializer,
    ReconciliationSerializer,
    RequestRollbackResultSerializer,
    RequestRollbackStateSerializer,
    RollbackSerializer,
    SignoffSerializer,
    rows_page,
)
from backfill_portal.recovery import reconciliation as reconciliation_service
from backfill_portal.recovery import rollback as rollback_service
from rest_framework import renderers
from rest_framework.reverse import reverse


class RequestViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    lookup_value_regex = ID_LOOKUP
    filterset_fields = ["status", "job__name", "requested_by__username", "cascade"]
    extra_query_parameters = ("mine",)
    ordering = "-id"

    def get_queryset(self):
        return request_list(user=self.request.user, mine=query_flag(self.request, "mine"))

    @extend_schema(parameters=[flag_parameter("mine", "1: only requests I filed")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def get_serializer_class(self):
        return RequestDetailSerializer if self.action == "retrieve" else RequestSerializer

    def initial(self, request, *args, **kwargs):
        """Who may ask (DRF's checks), then whether the request exists, then the body:
        an action on a request that does not exist is a 404 whatever its body says."""
        super().initial(request, *args, **kwargs)
        if self.detail and request.method == "POST" and "pk" in kwargs:
            request_get(kwargs["pk"])

    def _body(self, serializer_class, action: str) -> dict:
        """The action's body, validated; when it is refused, someone who may not act on
        this request at all hears that first (an audited 403), as with a valid body."""
        return validated_or_refused(serializer_class, self.request.data, permission=lambda: policy.require_request_action(
            self.request.user, request_get(self.kwargs["pk"]), action))

    def _detail(self, request_obj, code=status.HTTP_200_OK, **context):
        request_obj = request_get(request_obj.pk)
        data = RequestDetailSerializer(request_obj, context={"request": self.request, **context}).data
        return Response(data, status=code)

    @extend_schema(request=RequestCreateSerializer, responses={201: RequestDetailSerializer, 200: RequestDetailSerializer})
    def create(self, request):
        body = RequestCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        obj, created = backfill_request_create(actor=request.user, **body.validated_data)
        return self._detail(obj, status.HTTP_201_CREATED if created else status.HTTP_200_OK, intervals_limit=None)

    @extend_schema(request=RequestPreviewSerializer, responses=RequestPreviewResultSerializer,
                   description="The plan a request would freeze, without writing anything: its intervals "
                               "(with the stale later partitions of a depends_on_past dataset, which "
                               "`exclude_stale` may leave out), the cascade, the approval steps, overlaps.")
    @action(detail=False, methods=["post"])
    def preview(self, request):
        body = RequestPreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        job = Job.objects.select_related("dataset__owner").filter(name=data.pop("job"), dataset__is_source=False).first()
        if job is None:
            raise ValidationError(f"job {request.data.get('job')!r} does not exist or is a source", field="job")
        plan = request_plan_preview(user=request.user, **data, job=job)
        return Response(RequestPreviewResultSerializer({
            "job": job.name, "intervals": len(plan.planned), "total": plan.total,
            "first_partition": plan.planned[0].partition_key, "last_partition": plan.planned[-1].partition_key,
            "range_start": plan.planned[0].start, "range_end": plan.planned[-1].end,
            "stale": [{"job": s.job.name, **s.as_dict()} for s in plan.stale],
            "downstream": [{"job": n.job.name, "layer": n.layer, "action": n.action, "intervals": len(n.partitions)}
                           for n in plan.downstream],
            "approval_steps": [{"kind": st.kind, "dataset": st.dataset.name if st.dataset else None,
                                "job": st.job.name if st.job else None,
                                "approver": st.approver.username if st.approver else None} for st in plan.steps],
            "overlaps": [o.pk for o in plan.overlaps],
        }).data)

    @extend_schema(request=SubmitSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def submit(self, request, pk=None):
        body = self._body(SubmitSerializer, "submit")
        return self._detail(backfill_request_submit(actor=request.user, request_id=pk, **body))

    @extend_schema(request=ReasonSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        body = self._body(ReasonSerializer, "cancel")
        return self._detail(backfill_request_cancel(actor=request.user, request_id=pk, **body))

    @extend_schema(request=CommentSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        body = self._body(CommentSerializer, "approve")
        return self._detail(backfill_request_decide(actor=request.user, request_id=pk, approve=True, **body))

    @extend_schema(request=CommentSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        body = self._body(CommentSerializer, "reject")
        return self._detail(backfill_request_decide(actor=request.user, request_id=pk, approve=False, **body))

    @extend_schema(request=None, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._detail(request_pause(actor=request.user, request_id=pk))

    @extend_schema(request=None, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._detail(request_resume(actor=request.user, request_id=pk))

    @extend_schema(request=None, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def retry_failed(self, request, pk=None):
        return self._detail(request_retry_failed(actor=request.user, request_id=pk))

    # -- reconciliation, sign-off and rollback ------------------------------------------

    def _reconciliation(self, obj, *, fmt, rows_query: dict):
        page = rows_page(obj, request=self.request, **rows_query)
        data = ReconciliationSerializer(obj, context={"request": self.request, "rows_page": page}).data
        response = Response(data)
        if fmt == "csv" or self.request.query_params.get("format") == "csv":
            response["Content-Disposition"] = f'attachment; filename="request-{obj.request_id}-reconciliation.csv"'
        return response

    @extend_schema(methods=["GET"], request=None, responses={200: ReconciliationSerializer, **error_responses(400, 401, 403, 404, 409)},
                   parameters=[ReconciliationRowsQuerySerializer],
                   description="The manifest and the four numbers per interval (computed on first read; 409 "
                               "while nothing has run yet): every row, or one verdict's (`verdict`), a page at "
                               "a time (`limit`, `offset`; `next` names the following page). "
                               "`?format=csv` or `reconciliation.csv` exports the table (the same rows) and the "
                               "manifest.")
    @extend_schema(methods=["POST"], request=None, responses=ReconciliationSerializer,
                   parameters=[ReconciliationRowsQuerySerializer],
                   description="Recompute the reconciliation now (explanations are kept).")
    @action(detail=True, methods=["get", "post"],
            renderer_classes=[renderers.JSONRenderer, renderers.BrowsableAPIRenderer, ReconciliationCSVRenderer])
    def reconciliation(self, request, pk=None, format=None):
        # Before anything is computed: a refused query leaves nothing done (and someone who
        # may not recompute hears that first, audited, as with a valid query).
        recompute = request.method == "POST"
        query = validated_or_refused(ReconciliationRowsQuerySerializer, request.query_params, permission=lambda: (
            recompute and policy.require_review(request.user, request_get(pk), "reconciliation.compute")))
        if recompute:
            obj = reconciliation_service.reconciliation_recompute(actor=request.user, request_id=pk)
        else:
            obj = reconciliation_service.reconciliation_get(request_id=pk)
        return self._reconciliation(obj, fmt=format, rows_query=query)

    @extend_schema(request=ExplainSerializer, responses=ReconciliationRowSerializer)
    @action(detail=True, methods=["post"], url_path=r"intervals/(?P<key>[^/]+)/explain")
    def explain(self, request, pk=None, key=None):
        body = self._body(ExplainSerializer, "explain")
        row = reconciliation_service.interval_explain(actor=request.user, request_id=pk, partition_key=key, **body)
        return Response(ReconciliationRowSerializer(row).data)

    @extend_schema(request=SignoffSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def signoff(self, request, pk=None):
        body = self._body(SignoffSerializer, "signoff")
        return self._detail(reconciliation_service.reconciliation_signoff(actor=request.user, request_id=pk, **body))

    @extend_schema(methods=["POST"], request=RollbackSerializer, responses=RequestRollbackResultSerializer,
                   description="Move every partition this request published back to its previous verified "
                               "version (compare-and-set: 409 if someone published since), and list the "
                               "consumer runs that read the rolled-back versions and the contaminated closure "
                               "(`impact`).")
    @extend_schema(methods=["GET"], request=None, responses=RequestRollbackStateSerializer,
                   description="What this request's rollback did: the versions rolled back, their consumers "
                               "and the contaminated closure (`impact`).")
    @action(detail=True, methods=["get", "post"])
    def rollback(self, request, pk=None):
        if request.method == "GET":
            state = rollback_service.rollback_state(request_id=pk)
        else:
            body = self._body(RollbackSerializer, "rollback")
            state = rollback_service.request_rollback(actor=request.user, request_id=pk, **body)
        state["rebuild"] = reverse("api-request-rollback-rebuild", kwargs={"pk": pk}, request=request)
        return Response(state)

    @extend_schema(request=None, responses={201: RequestSerializer(many=True), 200: RequestSerializer(many=True)},
                   description="One click: file (create and submit) ONE request rebuilding the whole contaminated "
                               "closure of this request's rollback in layer order, parent = this request: 201. "
                               "Asking again returns the same request: 200.")
    # A plain list of the requests filed (no pagination, no list filters): the schema said
    # a paginated page with six query parameters it ignores.
    @action(detail=True, methods=["post"], url_path="rollback/rebuild", url_name="rollback-rebuild",
            pagination_class=None, filter_backends=[])
    def rollback_rebuild(self, request, pk=None):
        filed = rollback_service.rollback_rebuild(actor=request.user, request_id=pk)
        return Response(RequestSerializer(filed.requests, many=True).data,
                        status=status.HTTP_201_CREATED if filed.new else status.HTTP_200_OK)
