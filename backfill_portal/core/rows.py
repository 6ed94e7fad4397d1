"""Fixed statements for the writes every backfill interval repeats many times.

The ORM compiles an INSERT or UPDATE anew on every call; for the audit events, outbox
rows, runs, attempts and publications it inserts, and the state claims and outbox
stamps it updates (some thirty per interval), that compilation was most of their CPU.
These build each statement's text once per process (per model and set of columns) and
let the model's own fields prepare the values, as `save()` and `update()` would. They
send no signals: none of these models has receivers.
"""
from __future__ import annotations

import functools

from django.db import DEFAULT_DB_ALIAS, connection, connections, models


@functools.lru_cache(maxsize=64)
def _insert_statement(model: type[models.Model], vendor: str, with_pk: bool, *, returning: bool = False,
                      ignore_conflicts: bool = False) -> tuple[str, tuple]:
    """The one-row INSERT of `model`'s concrete fields (its primary key too if
    `with_pk`), returning the key or skipping a unique conflict if asked, and those
    fields in the statement's order."""
    meta, quote = model._meta, connection.ops.quote_name
    fields = tuple(f for f in meta.concrete_fields if with_pk or not f.primary_key)
    tail = (f" RETURNING {quote(meta.pk.column)}" if returning else "") + (
        " ON CONFLICT DO NOTHING" if ignore_conflicts else "")
    sql = (f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}){tail}")
    return sql, fields


def insert_row(instance: models.Model, *, with_pk: bool = False) -> models.Model:
    """INSERT a new instance (never an update) and set its primary key (or, with_pk,
    insert the one it carries). Field defaults and `auto_now_add` are applied by the
    fields (`pre_save`), as `save()` does."""
    conn = connections[DEFAULT_DB_ALIAS]  # `connection` is a proxy: one lookup, not one a field
    sql, fields = _insert_statement(type(instance), conn.vendor, with_pk, returning=True)
    params = [f.get_db_prep_save(f.pre_save(instance, True), conn) for f in fields]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        instance.pk = cursor.fetchone()[0]
    instance._state.adding = False
    instance._state.db = conn.alias
    return instance


def _insert_many(instances: list[models.Model], *, with_pk: bool, ignore_conflicts: bool) -> None:
    """One statement of one row, executed for every instance in one call: psycopg
    pipelines the rows in one round trip and, the statement being short and the same
    every time, converts it once per process and prepares it on the server (a
    multi-row INSERT of dozens of rows has hundreds of parameters, which psycopg
    parses again on every execution: most of an audit batch's cost); SQLite compiles
    it once."""
    if not instances:
        return
    conn = connections[DEFAULT_DB_ALIAS]  # `connection` is a proxy: one lookup, not one a field
    sql, fields = _insert_statement(type(instances[0]), conn.vendor, with_pk, ignore_conflicts=ignore_conflicts)
    rows = [[f.get_db_prep_save(f.pre_save(instance, True), conn) for f in fields] for instance in instances]
    with conn.cursor() as cursor:
        if len(rows) == 1:
            cursor.execute(sql, rows[0])  # no pipeline to open and sync for one row
        else:
            cursor.executemany(sql, rows)
    for instance in instances:
        instance._state.adding = False
        instance._state.db = conn.alias


def insert_rows(instances: list[models.Model]) -> None:
    """INSERT new instances of one model, each with the primary key it carries (never
    an update), in one round trip. Field defaults and `auto_now_add` are applied by
    the fields, as in `insert_row`."""
    _insert_many(instances, with_pk=True, ignore_conflicts=False)


def insert_new_rows(instances: list[models.Model], *, ignore_conflicts: bool = False) -> None:
    """INSERT new instances of one model whose primary keys the database gives, in one
    round trip, as `bulk_create` would (its `ignore_conflicts`: a row that breaks a
    unique constraint is skipped; SQLite and PostgreSQL both take `ON CONFLICT DO
    NOTHING`) but with a statement built once per process; the instances' primary keys
    are not read back."""
    _insert_many(instances, with_pk=False, ignore_conflicts=ignore_conflicts)


def update_row(model: type[models.Model], pk, values: dict, *, where: dict) -> int:
    """UPDATE row `pk` of `model` to `values` only while its columns still hold `where`
    (None: IS NULL); returns the rows changed, 0 when the row moved on. A model
    instance given for a foreign key stands for its key, as in update()."""
    meta = model._meta
    params = [_prepared(meta.get_field(name), value) for name, value in values.items()]
    params.append(meta.pk.get_db_prep_value(pk, connection))
    params += [_prepared(meta.get_field(name), value) for name, value in where.items() if value is not None]
    conditions = tuple((name, where[name] is None) for name in where)
    with connection.cursor() as cursor:
        cursor.execute(_update_statement(model, tuple(values), conditions, connection.vendor), params)
        return cursor.rowcount


def _prepared(field: models.Field, value):
    if hasattr(value, "prepare_database_save"):  # a model instance for a foreign key
        value = value.prepare_database_save(field)
    return field.get_db_prep_save(value, connection)


@functools.lru_cache(maxsize=256)
def _update_statement(model: type[models.Model], names: tuple[str, ...], conditions: tuple[tuple[str, bool], ...],
                      vendor: str) -> str:
    meta, quote = model._meta, connection.ops.quote_name
    sets = ", ".join(f"{quote(meta.get_field(name).column)} = %s" for name in names)
    wheres = [f"{quote(meta.pk.column)} = %s"] + [
        f"{quote(meta.get_field(name).column)} {'IS NULL' if is_null else '= %s'}" for name, is_null in conditions]
    return f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {' AND '.join(wheres)}"
