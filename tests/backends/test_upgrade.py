"""`manage.py upgrade_warehouse_layout`: a warehouse of the view layout (before issue
#15: `<dataset>` a view joining `<dataset>__versions` to the pointer table), built here
with plain SQL as that code built it, converted to reader tables with every version,
marker, pointer and pointer move kept; on SQLite and PostgreSQL."""
from __future__ import annotations

import psycopg
import pytest
from django.core.management import CommandError, call_command

from backfill_portal.backends import DatasetSpec, get_warehouse, make_warehouse, reset_warehouse_cache
from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.specs import spec_for
from backfill_portal.core.errors import ValidationError
from backfill_portal.core.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)

DAY, NEXT_DAY = "2022-10-01", "2022-10-02"
# run -> (partition, rows); old-2 replaced old-1 on DAY, which stays for rollback.
RUNS = {
    "old-1": (DAY, [("o1", "i1", "toys", 10.5), ("o2", "i1", "books", 3.0)]),
    "old-2": (DAY, [("o1", "i1", "toys", 11.5), ("o2", "i1", "books", 3.0), ("o3", "i2", "toys", 1.25)]),
    "old-3": (NEXT_DAY, [("o4", "i1", "food", 7.0)]),
    "old-unpublished": (NEXT_DAY, [("o5", "i1", "food", 99.0)]),
}
HISTORY = [("old-1", DAY, None), ("old-2", DAY, "old-1"), ("old-3", NEXT_DAY, None)]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def old_url(request, tmp_path, settings):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.sqlite3'}"
    else:
        url = request.getfixturevalue("pg_url")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
    settings.WAREHOUSE_URL = url
    reset_warehouse_cache()
    yield url
    reset_warehouse_cache()


def build_view_layout(url: str, spec: DatasetSpec) -> None:
    """The earlier layout, as its code wrote it: the bookkeeping tables (unchanged
    since), one heap of every version, the reader view over it and the pointer."""
    wh = make_warehouse(url)
    wh.ensure_meta()
    pg = wh.dialect == "postgresql"
    physical = {"text": "text" if pg else "TEXT", "numeric": "numeric" if pg else "REAL"}
    columns = ", ".join(f'"{c.name}" {physical[c.type]}' for c in spec.columns)
    heap = f"{spec.name}__versions"
    wh.execute(f'CREATE TABLE "{heap}" ({columns}, "_run_id" TEXT NOT NULL, "_partition" TEXT NOT NULL, '
               '"_attempt" INTEGER)')
    wh.execute(f'CREATE INDEX "{heap}_run" ON "{heap}" ("_run_id")')
    selected = ", ".join(f'v."{c}"' for c in spec.column_names)
    wh.execute(f'''CREATE VIEW "{spec.name}" AS SELECT {selected}, v."_partition", v."_run_id"
        FROM "{heap}" AS v JOIN "_bf_current" AS c ON c."dataset" = '{spec.name}'
        AND c."partition" = v."_partition" AND c."run_id" = v."_run_id"''')
    ts = "2022-10-03 00:00:00" + ("+00" if pg else "")
    for run_id, (partition, rows) in RUNS.items():
        for row in rows:
            wh.execute(f'INSERT INTO "{heap}" VALUES (?, ?, ?, ?, ?, ?, 1)', (*row, run_id, partition))
        wh.execute('INSERT INTO "_bf_markers" VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
                   (run_id, spec.name, partition, len(rows), f"fp-{run_id}", ts, 0, len(rows),
                    sum(r[3] for r in rows), spec.numbers_of))
    for run_id, partition, previous in HISTORY:
        wh.execute('INSERT INTO "_bf_current" VALUES (?, ?, ?, ?) ON CONFLICT ("dataset", "partition") '
                   'DO UPDATE SET "run_id" = excluded."run_id"', (spec.name, partition, run_id, ts))
        wh.execute('INSERT INTO "_bf_publications" ("dataset", "partition", "run_id", "previous_run_id", "action", '
                   '"actor", "published_at") VALUES (?, ?, ?, ?, ?, ?, ?)',
                   (spec.name, partition, run_id, previous, "publish", "olivia", ts))
    wh.close()


def rows_of(wh, sql: str) -> list[tuple]:
    return sorted((r[0], r[1], r[2], round(float(r[3]), 2)) for r in wh.query(
        f'SELECT "order_id", "item_id", "category", "amount" FROM {sql} AS v'))


def reader_relation_kind(wh, name: str) -> str:
    if wh.dialect == "postgresql":
        return wh.query("SELECT relkind FROM pg_class WHERE oid = to_regclass(?)", (f'"{name}"',))[0][0]
    return wh.query("SELECT type FROM sqlite_master WHERE name = ?", (name,))[0][0]


def test_the_upgrade_converts_a_view_layout_keeping_every_version_and_the_history(catalog, old_url, capsys):
    spec = spec_for(Dataset.objects.get(name="dwd_order_items"))
    build_view_layout(old_url, spec)
    before = make_warehouse(old_url)
    history = before.history(spec.name, DAY) + before.history(spec.name, NEXT_DAY)
    markers = before.markers(list(RUNS))
    # The new code refuses the old layout with a line that says what to do.
    with pytest.raises(ValidationError, match="upgrade_warehouse_layout"):
        make_warehouse(old_url).ensure_dataset(spec)
    if before.dialect == "postgresql":  # readers were granted the view
        before.execute("DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bf_test_reader') "
                       "THEN CREATE ROLE bf_test_reader; END IF; END $$")
        before.execute(f'GRANT SELECT ON "{spec.name}" TO bf_test_reader')

    call_command("upgrade_warehouse_layout", "--reason", "test upgrade")

    out = capsys.readouterr().out
    assert "dwd_order_items: converted (versions 4, " in out
    wh = get_warehouse()
    assert reader_relation_kind(wh, spec.name) == ("p" if wh.dialect == "postgresql" else "table")
    if wh.dialect == "postgresql":  # and the reader table that replaces it keeps the grant
        assert wh.query(f"SELECT has_table_privilege('bf_test_reader', '\"{spec.name}\"', 'SELECT')")[0][0]
    # Readers see exactly the published versions, in a real table.
    assert rows_of(wh, f'(SELECT * FROM "{spec.name}" WHERE "_partition" = \'{DAY}\')') == sorted(RUNS["old-2"][1])
    assert rows_of(wh, f'"{spec.name}"') == sorted(RUNS["old-2"][1] + RUNS["old-3"][1])
    # Every version is kept, readable by pin, with its marker; the history is whole.
    for run_id, (partition, rows) in RUNS.items():
        assert rows_of(wh, wh.ref_sql(spec=spec, pins={partition: run_id})) == sorted(rows)
    assert wh.markers(list(RUNS)) == markers
    assert wh.history(spec.name, DAY) + wh.history(spec.name, NEXT_DAY) == history
    assert wh.current_many(spec.name, [DAY, NEXT_DAY]) == {DAY: "old-2", NEXT_DAY: "old-3"}
    event = AuditEvent.objects.get(action="warehouse.upgrade_layout", dataset=spec.name)
    assert event.reason == "test upgrade" and event.data["versions"] == 4
    # A rollback to the replaced version, and a new publish, work in the new layout.
    wh.rollback(name=spec.name, partition=DAY, to_run_id="old-1", expected_run_id="old-2", actor="oncall")
    assert rows_of(wh, f'"{spec.name}"') == sorted(RUNS["old-1"][1] + RUNS["old-3"][1])
    wh.stage_rows(spec=spec, run_id="new-1", attempt_no=1, partition=NEXT_DAY, rows=[("o9", "i1", "food", 1.0)])
    wh.publish(spec_or_name=spec, partition=NEXT_DAY, run_id="new-1", expected_run_id="old-3", actor="olivia")
    assert rows_of(wh, f'"{spec.name}"') == sorted(RUNS["old-1"][1] + [("o9", "i1", "food", 1.0)])
    assert not wh.table_exists(f"{spec.name}__versions") or wh.dialect == "sqlite"

    # Again: nothing to do, nothing changed.
    call_command("upgrade_warehouse_layout", "--dataset", spec.name)
    assert "dwd_order_items: nothing to convert" in capsys.readouterr().out
    assert AuditEvent.objects.filter(action="warehouse.upgrade_layout").count() == 1


def test_the_upgrade_names_an_unknown_dataset_in_one_line(catalog, old_url):
    with pytest.raises(CommandError, match="no produced dataset named 'nope' in the catalog"):
        call_command("upgrade_warehouse_layout", "--dataset", "nope")
    with pytest.raises(CommandError, match="--dataset needs a dataset's name"):
        call_command("upgrade_warehouse_layout", "--dataset", "")


def build_wide_current_layout(url: str, spec: DatasetSpec) -> None:
    """SQLite's first current-table layout (issue #15's first round), as its code wrote
    it: the view layout's heap and bookkeeping, and `<dataset>` a table storing
    `_partition` and `_run_id` in every row, indexed on `_partition` and the partition
    key, holding the published rows."""
    build_view_layout(url, spec)
    wh = make_warehouse(url)
    columns = ", ".join(f'"{c.name}" {"REAL" if c.type == "numeric" else "TEXT"}' for c in spec.columns)
    listed = ", ".join(f'"{c}"' for c in (*spec.column_names, "_partition", "_run_id"))
    wh.execute(f'CREATE TABLE "{spec.name}__wide" ({columns}, "_partition" TEXT NOT NULL, "_run_id" TEXT NOT NULL)')
    wh.execute(f'INSERT INTO "{spec.name}__wide" ({listed}) SELECT {listed} FROM "{spec.name}"')
    wh.execute(f'DROP VIEW "{spec.name}"')
    wh.execute(f'ALTER TABLE "{spec.name}__wide" RENAME TO "{spec.name}"')
    for i, column in enumerate(dict.fromkeys(("_partition", spec.partition_key_column))):
        wh.execute(f'CREATE INDEX "old_{i}" ON "{spec.name}" ("{column}")')
    wh.close()


def test_sqlite_s_wide_current_table_keeps_working_and_the_upgrade_narrows_it(catalog, old_url, capsys):
    """A current table of the first layout (the run and partition stored in every row)
    is still read and published by the new code; the upgrade rebuilds it without them,
    keeping every version, pointer and pointer move."""
    if not old_url.startswith("sqlite"):
        pytest.skip("SQLite's current table")
    spec = spec_for(Dataset.objects.get(name="dwd_order_items"))
    build_wide_current_layout(old_url, spec)
    wh = make_warehouse(old_url)
    history = wh.history(spec.name, DAY) + wh.history(spec.name, NEXT_DAY)
    wh.ensure_dataset(spec)  # the old table is the portal's: not refused
    assert {r["_run_id"] for r in wh.read_partition(spec.name, DAY)} == {"old-2"}
    wh.rollback(name=spec.name, partition=DAY, to_run_id="old-1", expected_run_id="old-2", actor="oncall")
    assert rows_of(wh, f'"{spec.name}"') == sorted(RUNS["old-1"][1] + RUNS["old-3"][1])
    wh.close()

    call_command("upgrade_warehouse_layout", "--reason", "narrow the reader table")

    assert "dwd_order_items: converted (versions 4, published rows 3)" in capsys.readouterr().out
    wh = get_warehouse()
    stored = [name for (name,) in wh.query("SELECT name FROM pragma_table_info(?)", (spec.name,))]
    assert stored == list(spec.column_names) + ([] if spec.partition_column else ["_partition"])
    assert rows_of(wh, f'"{spec.name}"') == sorted(RUNS["old-1"][1] + RUNS["old-3"][1])
    assert {r["_run_id"] for r in wh.read_partition(spec.name, NEXT_DAY)} == {"old-3"}
    assert wh.history(spec.name, DAY) + wh.history(spec.name, NEXT_DAY) != history  # the rollback above
    assert len(wh.history(spec.name, DAY)) == 3
    wh.stage_rows(spec=spec, run_id="new-1", attempt_no=1, partition=DAY, rows=[("o9", "i1", "food", 1.0)])
    wh.publish(spec_or_name=spec, partition=DAY, run_id="new-1", expected_run_id="old-1", actor="olivia")
    assert rows_of(wh, f'"{spec.name}"') == sorted([("o9", "i1", "food", 1.0)] + RUNS["old-3"][1])
    call_command("upgrade_warehouse_layout")
    assert "dwd_order_items: nothing to convert" in capsys.readouterr().out
