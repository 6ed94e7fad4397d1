from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination, LimitOffsetPagination

# The largest primary key a bigint holds: a position past it cannot name a row.
MAX_ID = 2**63 - 1


def query_count(request, name: str, *, minimum: int, default: int, cutoff: int | None = None) -> int:
    """A whole-number query parameter, strictly: absent is `default`, above `cutoff` is
    `cutoff`, and anything else that is not a whole number from `minimum` is a 400
    naming the parameter. DRF's paginators read `page_size=0`, `-1` or `abc` as the
    default; an offset past what a database integer holds cannot name a row either."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    value = raw.strip()
    if not (value.isascii() and value.isdigit()) or not minimum <= int(value) <= MAX_ID:
        raise ValidationError({name: [f"must be a whole number from {minimum}, not {raw[:40]!r}"]})
    return min(int(value), cutoff) if cutoff is not None else int(value)


def _with_minimum(parameters: list[dict], minimums: dict[str, int]) -> list[dict]:
    for parameter in parameters:
        if parameter["name"] in minimums:
            parameter["schema"] = {**parameter["schema"], "minimum": minimums[parameter["name"]]}
    return parameters


class IdCursorPagination(CursorPagination):
    """Keyset pagination on the primary key: constant cost however deep the page."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        return query_count(request, self.page_size_query_param, minimum=1, default=self.page_size,
                           cutoff=self.max_page_size)

    def get_schema_operation_parameters(self, view):
        return _with_minimum(super().get_schema_operation_parameters(view), {self.page_size_query_param: 1})

    def decode_cursor(self, request):
        """DRF's decoding, and the position must be an id: DRF passes whatever the
        cursor holds to the queryset's filter, so a hand-edited `p=abc` was a 500
        (ValueError) instead of the 404 'Invalid cursor' any other bad cursor gets."""
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            position = cursor.position.strip()
            if not (position.isascii() and position.isdigit() and int(position) <= MAX_ID):
                raise NotFound(self.invalid_cursor_message)
        return cursor


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """Limit and offset read strictly (`query_count`)."""

    def get_limit(self, request):
        return query_count(request, self.limit_query_param, minimum=1, default=self.default_limit,
                           cutoff=self.max_limit)

    def get_offset(self, request):
        return query_count(request, self.offset_query_param, minimum=0, default=0)

    def get_schema_operation_parameters(self, view):
        return _with_minimum(super().get_schema_operation_parameters(view),
                             {self.limit_query_param: 1, self.offset_query_param: 0})
