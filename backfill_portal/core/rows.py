"""A fixed INSERT for the rows every backfill interval writes many times.

The ORM compiles an INSERT anew on every `save()`; for the audit events, outbox rows,
runs, attempts and publications (some twenty per interval) that compilation was most
of their CPU. `insert_row` builds each model's statement text once per process and
lets the model's own fields prepare the values, as `save()` would. It sends no
signals: none of these models has receivers.
"""
from __future__ import annotations

import functools

from django.db import connection, models


@functools.lru_cache(maxsize=32)
def _insert_statement(model: type[models.Model], vendor: str) -> tuple[str, tuple]:
    meta, quote = model._meta, connection.ops.quote_name
    fields = tuple(f for f in meta.concrete_fields if not f.primary_key)
    sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quote(meta.pk.column)}")
    return sql, fields


def insert_row(instance: models.Model) -> models.Model:
    """INSERT a new instance (never an update) and set its primary key. Field defaults
    and `auto_now_add` are applied by the fields (`pre_save`), as `save()` does."""
    sql, fields = _insert_statement(type(instance), connection.vendor)
    params = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        instance.pk = cursor.fetchone()[0]
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance
