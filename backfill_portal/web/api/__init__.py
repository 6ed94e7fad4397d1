"""The REST API's views (one module per area) and serializers (serializers/)."""
from collections.abc import Callable

from rest_framework import exceptions


def validated_or_refused(serializer_class, data, *, permission: Callable[[], None]) -> dict:
    """The body, validated. When it is refused, `permission` (the action's policy check,
    which records a refusal in the audit log and raises) runs first: someone who may not
    act at all hears that, audited, before what is wrong with what they sent, as they
    would with a valid body."""
    body = serializer_class(data=data)
    if not body.is_valid():
        permission()
        raise exceptions.ValidationError(body.errors)
    return body.validated_data
