"""The API's JSON parser: DRF's, refusing a NUL character in any string or key, and a
body nested deeper than any request of this API is.

DRF's CharField already refuses a NUL in a value, but not in a dict key (e.g.
`node_actions`), nor in a value a view reads without a serializer; PostgreSQL cannot
store it, so one reaching a query would fail in the driver instead of answering 400.

Python's JSON decoder recurses once per level of nesting: an 800-byte body of
`[[[[…]]]]` exhausts the interpreter's recursion limit, which DRF's parser does not
catch (it catches ValueError). The deepest body this API takes is a few levels; 32 is
far above it.
"""
from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32


def problem_of(value) -> str | None:
    """What makes a parsed body unacceptable (a NUL in a string or key, or nesting
    deeper than MAX_DEPTH), or None; walked without recursion."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "a NUL character (\\u0000) is not allowed in a string"
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(item, dict):
            pending.extend((key, depth) for key in item)
            pending.extend((child, depth + 1) for child in item.values())
        else:
            pending.extend((child, depth + 1) for child in item)
    return None


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} levels") from None
        problem = problem_of(data)
        if problem:
            raise ParseError(f"JSON parse error - {problem}")
        return data
