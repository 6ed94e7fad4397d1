import django_filters
from django.conf import settings
from django.contrib.auth import authenticate
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from backfill_portal.core.api import ID_LOOKUP
from backfill_portal.core.authentication import locked_out_json
from backfill_portal.core.errors import NotFound, ValidationError
from backfill_portal.core.models import ApiToken, AuditEvent
from backfill_portal.core.text import no_control_characters
from backfill_portal.core.services.audit import audit_events_newest_first, audit_events_read
from backfill_portal.core.services.tokens import api_token_issue, api_token_revoke


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name")

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "action", "object_type", "object_id", "request_id", "dataset",
                  "from_state", "to_state", "reason", "data", "prev_hash", "hash", "key_id"]


class AuditFilter(django_filters.FilterSet):
    request = django_filters.NumberFilter(field_name="request_id")
    actor = django_filters.CharFilter(field_name="actor_name")
    action = django_filters.CharFilter(field_name="action", lookup_expr="startswith")
    dataset = django_filters.CharFilter(field_name="dataset")
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["request", "actor", "action", "dataset", "since", "until"]


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The append-only audit log. Every authenticated role may read it."""

    lookup_value_regex = ID_LOOKUP
    serializer_class = AuditEventSerializer
    filterset_class = AuditFilter
    ordering = "-id"

    def get_queryset(self):
        return AuditEvent.objects.all()

    # A page's ids first, then its events read as the audit page and CSV read them: on
    # SQLite an event whose timestamp was edited into text that is not a time made the
    # whole list a 500 (its `at` is null here; verify_audit names the event).
    def list(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset.only("pk"))  # the cursor reads the id alone
        events = audit_events_newest_first(e.pk for e in page)
        return self.get_paginated_response(self.get_serializer(events, many=True).data)

    def retrieve(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        pk = self.kwargs[self.lookup_url_kwarg or self.lookup_field]
        event = next(iter(audit_events_read(queryset.filter(pk=pk))), None)
        if event is None:
            raise NotFound(f"no audit event #{pk}")
        return Response(self.get_serializer(event).data)


# --- API tokens -------------------------------------------------------------------------

class TokenObtainSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False, style={"input_type": "password"})
    days = serializers.IntegerField(required=False, min_value=1, max_value=settings.API_TOKEN_MAX_DAYS,
                                    help_text="how long the token is valid (default API_TOKEN_DAYS)")
    label = serializers.CharField(required=False, allow_blank=True, max_length=100, validators=[no_control_characters],
                                  help_text="what the token is for, to tell tokens apart")


class TokenIssuedSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="send as `Authorization: Token <token>`; shown only this once")
    token_id = serializers.IntegerField()
    username = serializers.CharField()
    label = serializers.CharField()
    expires_at = serializers.DateTimeField()


class AuthErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField()
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()), required=False)


class TokenObtainView(APIView):
    """Trade a username and password for an API token that expires. Failed attempts
    count towards the sign-in lockout and are audited like a failed web sign-in."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request=TokenObtainSerializer, auth=[], responses={
        201: TokenIssuedSerializer,
        400: OpenApiResponse(AuthErrorSerializer, description="a field is missing or wrong, or the username and "
                                                          "password do not match an active user"),
        429: OpenApiResponse(AuthErrorSerializer, description="the username is locked after repeated failed sign-ins"),
    })
    def post(self, request):
        body = TokenObtainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        # The DRF request itself: axes marks on it whether a lock refused this attempt.
        user = authenticate(request=request, username=data["username"], password=data["password"])
        if user is None:
            if getattr(request, "axes_locked_out", False):
                return locked_out_json(data["username"])
            raise ValidationError("no active user has this username and password", field="password")
        token, key = api_token_issue(actor=user, user=user, days=data.get("days"), label=data.get("label", ""),
                                     via="api")
        return Response({"token": key, "token_id": token.pk, "username": user.username, "label": token.label,
                         "expires_at": token.expires_at}, status=status.HTTP_201_CREATED)


class TokenRevokeView(APIView):
    """Revoke the token this call is made with."""

    @extend_schema(request=None, responses={
        204: None,
        400: OpenApiResponse(AuthErrorSerializer, description="the call was not made with an API token"),
        401: OpenApiResponse(AuthErrorSerializer, description="no credentials, or the token is unknown, expired "
                                                              "or already revoked"),
        409: OpenApiResponse(AuthErrorSerializer, description="a concurrent call revoked the same token first"),
    })
    def post(self, request):
        if not isinstance(request.auth, ApiToken):
            raise ValidationError("call this with the token to revoke (Authorization: Token <key>)",
                                  field="Authorization")
        api_token_revoke(actor=request.user, token=request.auth)
        return Response(status=status.HTTP_204_NO_CONTENT)
