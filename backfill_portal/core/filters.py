"""The API's query filters (django-filter), strict: a value a filter cannot read is a
400 naming it, never the whole unfiltered list. django-filter reads a boolean through
a select that turns anything it does not know ("maybe", "yes!") into "no filter", so
`?is_source=maybe` answered every dataset; here a boolean is one of true/false/1/0."""
from __future__ import annotations

import django_filters
from django.db import models
from django_filters.filterset import FILTER_FOR_DBFIELD_DEFAULTS
from django_filters.rest_framework import DjangoFilterBackend, FilterSet
from drf_spectacular.utils import OpenApiParameter, extend_schema_field
from rest_framework.exceptions import ValidationError

TRUE = ("true", "1")
BOOLEAN_CHOICES = [("true", "true"), ("false", "false"), ("1", "1"), ("0", "0")]


def _as_bool(value: str) -> bool:
    return value in TRUE


def query_flag(request, name: str) -> bool:
    """A boolean query parameter outside a filter set (`?mine=1`), as strictly: absent
    is false, anything but true/false/1/0 a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None:
        return False
    if raw not in dict(BOOLEAN_CHOICES):
        raise ValidationError({name: [f"must be one of {', '.join(v for v, _ in BOOLEAN_CHOICES)}, not {raw[:40]!r}"]})
    return _as_bool(raw)


def flag_parameter(name: str, description: str):
    """The schema of a `query_flag` parameter."""
    return OpenApiParameter(name, str, enum=[value for value, _ in BOOLEAN_CHOICES], description=description)


@extend_schema_field({"type": "string", "enum": [value for value, _ in BOOLEAN_CHOICES]})
class StrictBooleanFilter(django_filters.TypedChoiceFilter):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("choices", BOOLEAN_CHOICES)
        kwargs.setdefault("coerce", _as_bool)
        super().__init__(*args, **kwargs)


class PortalFilterSet(FilterSet):
    FILTER_DEFAULTS = {**FILTER_FOR_DBFIELD_DEFAULTS, models.BooleanField: {"filter_class": StrictBooleanFilter}}


class PortalFilterBackend(DjangoFilterBackend):
    """DjangoFilterBackend with the strict filters for `filterset_fields`; a list refuses
    a query parameter it does not take (`?stauts=failed` answered every run, and an
    auditor's `?actr=` the whole log), naming what it takes: its filters, its pager's,
    `format`, and the view's own (`extra_query_parameters`, e.g. `mine`)."""

    filterset_base = PortalFilterSet

    def filter_queryset(self, request, queryset, view):
        if getattr(view, "action", None) == "list":
            self._refuse_unknown_parameters(request, queryset, view)
        return super().filter_queryset(request, queryset, view)

    def _refuse_unknown_parameters(self, request, queryset, view) -> None:
        known = {"format", *getattr(view, "extra_query_parameters", ())}
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None:
            known |= set(filterset_class.base_filters)
        if getattr(view, "paginator", None) is not None:
            known |= {parameter["name"] for parameter in view.paginator.get_schema_operation_parameters(view)}
        refuse_unknown_parameters(request.query_params, known, what="this list")


def refuse_unknown_parameters(given, known: set[str], *, what: str) -> None:
    """A 400 naming each query parameter in `given` that is not `known` (`what` takes
    only those), and what it takes: a typo must not answer as if it filtered nothing."""
    unknown = sorted(set(given) - known)
    if unknown:
        takes = ", ".join(sorted(known))
        raise ValidationError({name[:40]: [f"is not a query parameter of {what}; it takes {takes}"]
                               for name in unknown[:10]})
