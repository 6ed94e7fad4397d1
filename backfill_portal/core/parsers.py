"""The API's JSON parser: DRF's, refusing a NUL character in any string or key.

DRF's CharField already refuses one in a value, but not in a dict key (e.g.
`node_actions`), nor in a value a view reads without a serializer; PostgreSQL cannot
store it, so one reaching a query would fail in the driver instead of answering 400.
"""
from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def contains_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(contains_nul(k) or contains_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(contains_nul(v) for v in value)
    return False


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        if contains_nul(data):
            raise ParseError("JSON parse error - a NUL character (\\u0000) is not allowed in a string")
        return data
