"""A produced dataset declares its partition column and its indexes in the catalog
(issue #15): synced with field errors naming the path, kept on the dataset, handed to
the warehouse backends by `spec_for`, shown on the dataset's page."""
from __future__ import annotations

import copy
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.services.sync import CatalogError, catalog_sync
from backfill_portal.catalog.specs import spec_for
from backfill_portal.core.models import AuditEvent
from tests.conftest import TEST_CATALOG

BASE = yaml.safe_load(TEST_CATALOG)
DS = {d["name"]: i for i, d in enumerate(BASE["datasets"])}
DEMO_CATALOG = Path(__file__).resolve().parents[2] / "backfill_portal" / "web" / "demo" / "catalog.yaml"


def declaring(**per_dataset) -> str:
    """TEST_CATALOG with keys set on datasets: declaring(dws_sales_daily={...})."""
    doc = copy.deepcopy(BASE)
    for name, keys in per_dataset.items():
        doc["datasets"][DS[name]].update(keys)
    return yaml.safe_dump(doc, sort_keys=False)


def path(name: str, key: str) -> str:
    return f"datasets[{DS[name]}].{key}"


def test_partition_column_and_indexes_are_synced_and_given_to_the_backends(personas):
    catalog_sync(text=declaring(dws_sales_daily={"partition_column": "ds",
                                                  "indexes": [["category"], ["ds", "category"]]}))
    dws = Dataset.objects.get(name="dws_sales_daily")
    assert (dws.partition_column, dws.indexes) == ("ds", [["category"], ["ds", "category"]])
    spec = spec_for(dws)
    assert spec.partition_column == "ds" and spec.partition_key_column == "ds"
    assert spec.indexes == (("category",), ("ds", "category"))


def test_the_reader_layout_is_the_catalog_s_else_a_table_for_an_hourly_dataset(personas):
    catalog_sync(text=TEST_CATALOG)
    layouts = {d.name: spec_for(d).reader_layout for d in Dataset.objects.filter(is_source=False)}
    # Hourly: a table (8,760 partitions a year); the others: the warehouse's default.
    assert layouts["page_views_hourly"] == "table"
    assert layouts["dws_sales_daily"] == layouts["monthly_summary"] == ""
    catalog_sync(text=declaring(dws_sales_daily={"reader_layout": "table"},
                                page_views_hourly={"reader_layout": "partitioned"}))
    assert spec_for(Dataset.objects.get(name="dws_sales_daily")).reader_layout == "table"
    assert spec_for(Dataset.objects.get(name="page_views_hourly")).reader_layout == "partitioned"
    event = AuditEvent.objects.filter(action="catalog.change", object_id="dws_sales_daily").latest("id")
    assert event.data["after"] == {"reader_layout": "table"}


def test_a_dataset_declaring_neither_keeps_the_bookkeeping_partition_and_no_indexes(personas):
    catalog_sync(text=TEST_CATALOG)
    spec = spec_for(Dataset.objects.get(name="dwd_order_items"))
    assert (spec.partition_column, spec.partition_key_column, spec.indexes) == ("", "_partition", ())


def test_one_column_name_is_an_index_of_that_column(personas):
    catalog_sync(text=declaring(dwd_order_items={"indexes": ["category", ["order_id"]]}))
    assert spec_for(Dataset.objects.get(name="dwd_order_items")).indexes == (("category",), ("order_id",))


def test_a_changed_declaration_is_synced_audited_and_idempotent(personas):
    catalog_sync(text=declaring(dws_sales_daily={"partition_column": "ds", "indexes": [["category"]]}))
    report = catalog_sync(text=declaring(dws_sales_daily={"partition_column": "ds",
                                                           "indexes": [["category"], ["gmv"]]}))
    assert "dataset dws_sales_daily" in report.changed
    event = AuditEvent.objects.filter(action="catalog.change", object_id="dws_sales_daily").latest("id")
    assert event.data["before"] == {"indexes": [["category"]]}
    assert event.data["after"] == {"indexes": [["category"], ["gmv"]]}
    again = catalog_sync(text=declaring(dws_sales_daily={"partition_column": "ds",
                                                          "indexes": [["category"], ["gmv"]]}))
    assert "dataset dws_sales_daily" in again.unchanged
    # Dropping both declarations goes back to the defaults.
    catalog_sync(text=TEST_CATALOG)
    dws = Dataset.objects.get(name="dws_sales_daily")
    assert (dws.partition_column, dws.indexes) == ("", [])


BAD = {
    "partition_column_not_declared": ({"dws_sales_daily": {"partition_column": "day"}},
                                      path("dws_sales_daily", "partition_column"), "'day' is not a declared column"),
    "partition_column_not_text": ({"dws_sales_daily": {"partition_column": "gmv"}},
                                  path("dws_sales_daily", "partition_column"), "must be a text column"),
    "partition_column_not_a_name": ({"dws_sales_daily": {"partition_column": ["ds"]}},
                                    path("dws_sales_daily", "partition_column"), "is not a declared column"),
    "partition_column_on_a_source": ({"ods_order_events": {"partition_column": "order_id"}},
                                     path("ods_order_events", "partition_column"), "a source is read as it is"),
    "reader_layout_unknown": ({"dws_sales_daily": {"reader_layout": "heap"}},
                              path("dws_sales_daily", "reader_layout"), "'heap' is not a reader layout"),
    "reader_layout_on_a_source": ({"ods_order_events": {"reader_layout": "table"}},
                                  path("ods_order_events", "reader_layout"), "a source is read as it is"),
    "indexes_not_a_list": ({"dws_sales_daily": {"indexes": {"category": True}}},
                           path("dws_sales_daily", "indexes"), "must be a list of indexes"),
    "index_empty": ({"dws_sales_daily": {"indexes": [[]]}},
                    f"{path('dws_sales_daily', 'indexes')}[0]", "non-empty list of column names"),
    "index_not_names": ({"dws_sales_daily": {"indexes": [[{"name": "ds"}]]}},
                        f"{path('dws_sales_daily', 'indexes')}[0]", "non-empty list of column names"),
    "index_unknown_column": ({"dws_sales_daily": {"indexes": [["category"], ["ds", "shop"]]}},
                             f"{path('dws_sales_daily', 'indexes')}[1]", "'shop' is not a declared column"),
    "index_column_twice": ({"dws_sales_daily": {"indexes": [["ds", "ds"]]}},
                           f"{path('dws_sales_daily', 'indexes')}[0]", "names a column twice"),
    "index_declared_twice": ({"dws_sales_daily": {"indexes": [["category"], "category"]}},
                             f"{path('dws_sales_daily', 'indexes')}[1]", "declared twice"),
    "indexes_on_a_source": ({"ods_order_events": {"indexes": [["order_id"]]}},
                            path("ods_order_events", "indexes"), "a source is read as it is"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_declaration_is_refused_naming_its_path_and_nothing_changes(personas, tmp_path, case):
    keys, where, message = BAD[case]
    catalog_sync(text=TEST_CATALOG)
    before = list(Dataset.objects.values_list("name", "partition_column", "indexes", "updated_at"))
    events = AuditEvent.objects.count()

    with pytest.raises(CatalogError) as exc:
        catalog_sync(text=declaring(**keys))
    assert where in exc.value.fields, exc.value.fields
    assert message in exc.value.fields[where][0], exc.value.fields[where]

    file = tmp_path / "catalog.yaml"
    file.write_text(declaring(**keys), encoding="utf-8")
    with pytest.raises(CommandError) as cmd:
        call_command("sync_catalog", str(file), stdout=StringIO())
    assert where in str(cmd.value) and "\n" not in str(cmd.value)

    assert list(Dataset.objects.values_list("name", "partition_column", "indexes", "updated_at")) == before
    assert AuditEvent.objects.count() == events


def test_every_bad_declaration_is_reported_at_once(personas):
    with pytest.raises(CatalogError) as exc:
        catalog_sync(text=declaring(dws_sales_daily={"partition_column": "gmv", "indexes": [["shop"]]},
                                    notify_finance={"indexes": [[]]}))
    assert {path("dws_sales_daily", "partition_column"), f"{path('dws_sales_daily', 'indexes')}[0]",
            f"{path('notify_finance', 'indexes')}[0]"} <= set(exc.value.fields)


def test_the_demo_catalog_declares_the_partition_columns_its_jobs_write(personas):
    """Each declared partition column is the one its job fills with the partition key
    (`{{ partition_key }} AS <column>`, or the side effect's `ds`), so every row holds it."""
    text = DEMO_CATALOG.read_text(encoding="utf-8")
    catalog_sync(text=text)
    doc = yaml.safe_load(text)
    jobs = {j["produces"]: j for j in doc["jobs"]}
    declared = {d.name: spec_for(d) for d in Dataset.objects.filter(is_source=False)}
    assert {name: s.partition_column for name, s in declared.items() if s.partition_column} == {
        "dws_sales_daily": "ds", "dws_customer_cumulative": "ds", "ads_gmv_report": "ds",
        "notify_finance": "ds", "dwd_page_views_hourly": "hour"}
    for name, spec in declared.items():
        if spec.partition_column and jobs[name]["kind"] == "sql":
            assert f"{{{{ partition_key }}}} AS {spec.partition_column}" in jobs[name]["sql"], name
    assert declared["dwd_order_items"].indexes == (("customer_id",),)
    assert declared["dwd_page_views_hourly"].indexes == (("page",),)
    assert declared["dwd_page_views_hourly"].reader_layout == "table"


def test_the_dataset_page_shows_the_partition_column_and_the_indexes(personas):
    catalog_sync(text=declaring(dws_sales_daily={"partition_column": "ds",
                                                  "indexes": [["category"], ["ds", "category"]]}))
    client = Client()
    client.force_login(personas["alice"])
    html = client.get("/datasets/dws_sales_daily/").content.decode()
    assert "Partition column</dt><dd><span class=\"mono\">ds</span>" in html
    assert "(category)</span>, <span class=\"mono\">(ds, category)</span>" in html
    plain = client.get("/datasets/dwd_order_items/").content.decode()
    assert "none declared: readers filter on the bookkeeping column" in plain
    assert "Indexes</dt><dd><span class=\"muted\">none declared</span>" in plain
    assert "Reader layout</dt><dd><span class=\"muted\">the warehouse's default</span>" in plain
    hourly = client.get("/datasets/page_views_hourly/").content.decode()
    assert "Reader layout</dt><dd><span class=\"mono\">table</span> <span class=\"muted\">(hourly)" in hourly
    source = client.get("/datasets/ods_order_events/").content.decode()
    assert "Partition column" not in source


def test_the_api_gives_both(personas):
    catalog_sync(text=declaring(dws_sales_daily={"partition_column": "ds", "indexes": [["category"]]}))
    client = Client()
    client.force_login(personas["alice"])
    body = client.get("/api/datasets/dws_sales_daily/").json()
    assert (body["partition_column"], body["indexes"]) == ("ds", [["category"]])
