"""Path converters that bound what a route accepts, so an over-long name or key is a
404 at the router, never a value too long for a column further in (the audit log's
object_id among them)."""
from __future__ import annotations

from django.urls import register_converter


class DatasetNameConverter:
    # As catalog.Dataset.name: a slug of at most 128 characters.
    regex = r"[-a-zA-Z0-9_]{1,128}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class PartitionKeyConverter(DatasetNameConverter):
    # The longest key the calendar makes is an hour with an offset and seconds
    # ("2022-10-04T05:00:00+08:00", 25 characters); 64 leaves room and bounds the rest.
    regex = r"[^/]{1,64}"


register_converter(DatasetNameConverter, "dataset")
register_converter(PartitionKeyConverter, "partition")
