"""Thin API views: parse, call one service, serialise."""
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from backfill_portal.backfills.api.serializers import (
    CommentSerializer,
    ReasonSerializer,
    RequestCreateSerializer,
    RequestDetailSerializer,
    RequestSerializer,
    SubmitSerializer,
)
from backfill_portal.backfills.selectors import request_list
from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
    request_get,
)
from backfill_portal.execution.services.dispatch import request_pause, request_resume, request_retry_failed


class RequestViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    filterset_fields = ["status", "job__name", "requested_by__username", "cascade"]
    ordering = "-id"

    def get_queryset(self):
        return request_list(user=self.request.user, mine=self.request.query_params.get("mine") == "1")

    def get_serializer_class(self):
        return RequestDetailSerializer if self.action == "retrieve" else RequestSerializer

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

    @extend_schema(request=SubmitSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def submit(self, request, pk=None):
        body = SubmitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._detail(backfill_request_submit(actor=request.user, request_id=pk, **body.validated_data))

    @extend_schema(request=ReasonSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._detail(backfill_request_cancel(actor=request.user, request_id=pk, **body.validated_data))

    @extend_schema(request=CommentSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        body = CommentSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._detail(backfill_request_decide(actor=request.user, request_id=pk, approve=True, **body.validated_data))

    @extend_schema(request=CommentSerializer, responses=RequestDetailSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        body = CommentSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._detail(backfill_request_decide(actor=request.user, request_id=pk, approve=False, **body.validated_data))

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
