from rest_framework.pagination import CursorPagination


class IdCursorPagination(CursorPagination):
    """Keyset pagination on the primary key: constant cost however deep the page."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
