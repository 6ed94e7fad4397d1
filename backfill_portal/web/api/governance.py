"""Approvals inbox and hand-off items: thin views over the governance services."""
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from backfill_portal.web.api import validated_or_refused
from backfill_portal.web.api.serializers.requests import ApprovalStepSerializer, CommentSerializer
from backfill_portal.backfills.models import ApprovalStep, HandoffItem
from backfill_portal.backfills import policy
from backfill_portal.backfills.services.handoff import handoff_accept, handoff_decline, handoff_get
from backfill_portal.backfills.selectors import steps_waiting_for
from backfill_portal.backfills.services.requests import approval_step_decide
from backfill_portal.core.api import ID_LOOKUP
from backfill_portal.core.filters import flag_parameter, query_flag
from backfill_portal.core.errors import NotFound


class ApprovalStepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Approval steps; `?mine=1` is the inbox: pending steps this user may decide."""

    lookup_value_regex = ID_LOOKUP
    serializer_class = ApprovalStepSerializer
    filterset_fields = ["status", "kind", "request"]
    extra_query_parameters = ("mine",)

    def get_queryset(self):
        if query_flag(self.request, "mine"):
            return steps_waiting_for(self.request.user).select_related("approver", "decided_by")
        return ApprovalStep.objects.select_related("request__job", "dataset", "job", "approver", "decided_by")

    @extend_schema(parameters=[flag_parameter("mine", "1: only steps waiting for me")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def _step(self, pk) -> ApprovalStep:
        step = ApprovalStep.objects.select_related("request__job__dataset", "dataset", "approver").filter(pk=pk).first()
        if step is None:
            raise NotFound(f"approval step {pk} does not exist")
        return step

    def _decide(self, request, pk, *, approve: bool) -> Response:
        step = self._step(pk)
        body = validated_or_refused(CommentSerializer, request.data, permission=lambda: policy.require_decide_step(
            request.user, step, approve=approve))
        step = approval_step_decide(actor=request.user, step=step, approve=approve, **body)
        return Response(ApprovalStepSerializer(self._step(step.pk)).data)

    @extend_schema(request=CommentSerializer, responses=ApprovalStepSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        return self._decide(request, pk, approve=True)

    @extend_schema(request=CommentSerializer, responses=ApprovalStepSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        return self._decide(request, pk, approve=False)


class HandoffSerializer(serializers.ModelSerializer):
    job = serializers.CharField(source="job.name")
    owner = serializers.CharField(source="owner.username")
    follow_up = serializers.IntegerField(source="follow_up_id", allow_null=True)

    class Meta:
        model = HandoffItem
        fields = ["id", "request", "job", "owner", "first_partition", "last_partition", "deadline", "status",
                  "decided_at", "comment", "follow_up"]


class HandoffViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    lookup_value_regex = ID_LOOKUP
    serializer_class = HandoffSerializer
    filterset_fields = ["status", "request"]
    extra_query_parameters = ("mine",)

    def get_queryset(self):
        qs = HandoffItem.objects.select_related("job", "owner")
        if query_flag(self.request, "mine"):
            qs = qs.filter(owner=self.request.user)
        return qs

    @extend_schema(parameters=[flag_parameter("mine", "1: only hand-offs for me")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def _body(self, pk, *, to: str) -> dict:
        """The comment, validated; an unknown item is a 404 and someone else's an
        audited 403 before anything is said about the body."""
        return validated_or_refused(CommentSerializer, self.request.data, permission=lambda: policy.require_decide_handoff(
            self.request.user, handoff_get(pk), to=to))

    @extend_schema(request=CommentSerializer, responses=HandoffSerializer)
    @action(detail=True, methods=["post"])
    def accept(self, request, pk=None):
        body = self._body(pk, to="accepted")
        return Response(HandoffSerializer(handoff_accept(actor=request.user, item_id=pk, **body)).data)

    @extend_schema(request=CommentSerializer, responses=HandoffSerializer)
    @action(detail=True, methods=["post"])
    def decline(self, request, pk=None):
        body = self._body(pk, to="declined")
        return Response(HandoffSerializer(handoff_decline(actor=request.user, item_id=pk, **body)).data)
