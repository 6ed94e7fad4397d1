from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination

# The largest primary key a bigint holds: a position past it cannot name a row.
MAX_ID = 2**63 - 1


class IdCursorPagination(CursorPagination):
    """Keyset pagination on the primary key: constant cost however deep the page."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

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
