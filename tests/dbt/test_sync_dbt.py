"""sync_dbt's mapping and its refusals (any warehouse: dbt parses and compiles without
connecting; runs need PostgreSQL)."""
from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from backfill_portal.catalog.models import CodeVersion, Dataset, Job
from backfill_portal.core.models import AuditEvent
from tests.dbt.conftest import SYNC_REASON, summary, sync_dbt

pytestmark = pytest.mark.django_db


def test_the_example_maps_sources_models_keys_owners_and_tests(personas, dbt_shop):
    lines = sync_dbt(dbt_shop)
    assert summary(lines) == "7 created, 0 changed, 0 unchanged"
    source, orders, daily = (Dataset.objects.get(name=n) for n in ("raw_orders", "orders", "daily_sales"))
    assert source.is_source and source.time_column == "ordered_at" and source.business_key == ["order_id"]
    assert (orders.owner.username, daily.owner.username) == ("olivia", "sam")
    assert (daily.business_key, daily.time_column, daily.grain, daily.core_measure) == \
        (["sales_date"], "sales_date", "day", "amount")
    assert [c["type"] for c in daily.columns] == ["date", "integer", "numeric"]
    job = Job.objects.get(name="daily_sales")
    assert job.kind == "dbt" and [d.name for d in job.upstreams.all()] == ["orders"]
    assert sorted(d.name for d in Job.objects.get(name="orders").upstreams.all()) == ["raw_orders"]
    frozen = job.current_code_version.definition["dbt"]
    assert frozen["model"] == "model.dbt_shop.daily_sales" and len(frozen["checksum"]) == 64
    assert Job.objects.get(name="orders").current_code_version.definition["dbt"]["macros"].keys() == \
        {"macro.dbt_shop.cents_to_amount"}
    checks = {c["name"]: c["blocking"] for c in daily.checks}
    assert checks == {"dbt_assert_daily_sales_amount_not_negative": True, "dbt_unique_daily_sales_sales_date": True,
                      "dbt_not_null_daily_sales_sales_date": True}
    assert all("{{ this }}" in c["sql"] for c in daily.checks)
    assert AuditEvent.objects.filter(action="catalog.code_version", object_id="daily_sales").count() == 1
    # Idempotent; a changed macro is a new code version of the model that uses it.
    assert summary(sync_dbt(dbt_shop)) == "0 created, 0 changed, 7 unchanged"
    macro = dbt_shop / "macros" / "cents_to_amount.sql"
    macro.write_text(macro.read_text().replace("numeric(12, 2)", "numeric(14, 2)"))
    lines = sync_dbt(dbt_shop)
    assert any(line.startswith("changed job orders code version") for line in lines)
    assert not any("job daily_sales" in line for line in lines)
    assert CodeVersion.objects.filter(job__name="orders").count() == 2


def test_a_warn_severity_test_is_a_non_blocking_check_and_a_model_without_time_is_refused(personas, dbt_shop):
    schema = dbt_shop / "models" / "schema.yml"
    text = schema.read_text().replace("tests: [not_null]", "tests: [{not_null: {config: {severity: warn}}}]")
    # daily_sales's owner comes from its group's owner when its meta names none.
    text = text.replace("        owner: sam\n", "").replace("      unique_key: sales_date\n",
                                                           "      unique_key: sales_date\n      group: sales\n")
    schema.write_text(text + "\ngroups:\n  - name: sales\n    owner: {name: sam}\n")
    (dbt_shop / "models" / "customers.sql").write_text("select distinct customer_id from {{ ref('orders') }}\n")
    (dbt_shop / "models" / "customer_ranks.sql").write_text("select customer_id from {{ ref('customers') }}\n")
    (dbt_shop / "dbt_project.yml").write_text((dbt_shop / "dbt_project.yml").read_text()
                                              + "    customers: {+materialized: table}\n"
                                              + "    customer_ranks: {+materialized: table}\n")
    lines = sync_dbt(dbt_shop)
    assert "refused model customers: no time column: not a microbatch model with event_time, and no " \
           "meta.portal.time_column; the portal backfills a model one interval at a time" in lines
    assert any(line.startswith("refused model customer_ranks: ") for line in lines)
    assert summary(lines).endswith(", 2 refused")
    assert not Job.objects.filter(name__in=["customers", "customer_ranks"]).exists()
    orders = Dataset.objects.get(name="orders")
    assert {c["name"]: c["blocking"] for c in orders.checks}["dbt_not_null_orders_amount"] is False
    assert Dataset.objects.get(name="daily_sales").owner.username == "sam"


def failure(path) -> str:
    with pytest.raises(CommandError) as exc:
        call_command("sync_dbt", str(path), "--actor", "olivia", "--reason", SYNC_REASON)
    return str(exc.value)


def test_every_audit_row_of_a_sync_names_who_synced_and_why_and_one_row_sums_it_up(personas, dbt_shop):
    sync_dbt(dbt_shop, actor="sam", reason="DEPLOY-42: the shop models")
    rows = list(AuditEvent.objects.filter(action__startswith="catalog."))
    assert {r.action for r in rows} == {"catalog.create", "catalog.code_version", "catalog.sync"}
    assert all(r.actor.username == "sam" and r.reason == "DEPLOY-42: the shop models" for r in rows)
    summary_row, = (r for r in rows if r.action == "catalog.sync")
    assert summary_row.object_type == "catalog" and summary_row.object_id == str(dbt_shop)
    assert summary_row.data["origin"] == "dbt" and summary_row.data["project"] == "dbt_shop"
    assert len(summary_row.data["created"]) == 7 and summary_row.data["changed"] == []
    # A sync that changes nothing writes nothing; a changed macro is one more sum-up, by its actor.
    sync_dbt(dbt_shop, actor="olivia", reason="no change")
    assert AuditEvent.objects.filter(action__startswith="catalog.").count() == len(rows)
    macro = dbt_shop / "macros" / "cents_to_amount.sql"
    macro.write_text(macro.read_text().replace("numeric(12, 2)", "numeric(14, 2)"))
    sync_dbt(dbt_shop, actor="olivia", reason="INC-7: wider amounts")
    latest = AuditEvent.objects.filter(action="catalog.sync").order_by("-id").first()
    assert latest.actor.username == "olivia" and latest.reason == "INC-7: wider amounts"
    assert any(line.startswith("job orders code version") for line in latest.data["changed"])
    assert AuditEvent.objects.filter(action="catalog.sync").count() == 2


@pytest.mark.parametrize("args, message", [
    ((), "--actor is required"),
    (("--actor", "olivia"), "--reason is required"),
    (("--actor", "olivia", "--reason", "   "), "--reason is required"),
    (("--actor", "nobody", "--reason", "x"), "'nobody' is not an active portal user"),
])
def test_a_sync_without_who_or_why_is_refused_and_writes_nothing(personas, dbt_shop, args, message):
    before = AuditEvent.objects.count()
    with pytest.raises(CommandError, match=message):
        call_command("sync_dbt", str(dbt_shop), *args)
    assert not Dataset.objects.exists() and not Job.objects.exists()
    assert AuditEvent.objects.count() == before


def test_bad_projects_are_refused_naming_the_model_and_the_field_and_nothing_is_written(personas, dbt_shop, tmp_path):
    schema = dbt_shop / "models" / "schema.yml"
    good = schema.read_text()
    schema.write_text(good.replace("owner: sam", "owner: zed"))
    assert "model daily_sales: meta.owner: owner 'zed' is not a user of the portal" in failure(dbt_shop)
    schema.write_text(good.replace("unique_key: sales_date", "unique_key: sale_day"))
    assert "model daily_sales: unique_key: 'sale_day' is not a column of the model" in failure(dbt_shop)
    # meta.portal's tolerances and limits as the YAML catalog's (int('abc') was a ValueError):
    daily = good.split("name: daily_sales", 1)
    schema.write_text(daily[0] + "name: daily_sales" + daily[1].replace(
        "portal: {team: shop, core_measure: amount}",
        "portal: {team: shop, core_measure: amount, tolerances: {row_band: abc}, max_attempts: lots}", 1))
    message = failure(dbt_shop)
    assert "model daily_sales: meta.portal.tolerances.row_band: must be a number" in message, message
    schema.write_text(good)
    model = dbt_shop / "models" / "daily_sales.sql"
    sql = model.read_text()
    model.write_text(sql.replace("group by 1", "group by 1 {{ no_such_macro() }}"))
    message = failure(dbt_shop)
    assert "model daily_sales: sql:" in message and "no_such_macro" in message
    model.write_text(sql.replace("count(*) as order_count", "count(*) as order_count, now() as loaded_at"))
    message = failure(dbt_shop)
    assert "model daily_sales: sql: CURRENT_TIMESTAMP() is not allowed: a job may read only its data interval" in message
    model.write_text(sql)
    (tmp_path / "target").mkdir()
    (tmp_path / "dbt_project.yml").write_text("name: broken\nprofile: broken\n")
    (tmp_path / "target" / "manifest.json").write_text(json.dumps({"nodes": "not a manifest"}))
    assert "is not a dbt manifest" in failure(tmp_path / "target" / "manifest.json")
    (tmp_path / "target" / "manifest.json").write_text("{not json")
    assert "is not JSON" in failure(tmp_path / "target" / "manifest.json")
    assert not Dataset.objects.exists() and not Job.objects.exists()


def test_a_manifest_json_syncs_like_its_project(personas, dbt_shop):
    sync_dbt(dbt_shop)  # parsing writes no target/ into the project ...
    assert not (dbt_shop / "target").exists()
    from backfill_portal.catalog import dbt_project

    manifest = dbt_project.parse_project(dbt_shop)
    (dbt_shop / "target").mkdir()
    manifest.writable_manifest().write(str(dbt_shop / "target" / "manifest.json"))
    assert summary(sync_dbt(dbt_shop / "target" / "manifest.json")) == "0 created, 0 changed, 7 unchanged"


@pytest.mark.django_db(transaction=True)
def test_on_the_sqlite_warehouse_a_dbt_request_is_refused_when_filed_with_a_clear_message(
        personas, dbt_shop, task_queue, warehouse, settings):
    """It used to be filed and approved, and its runs failed (the exploratory test)."""
    if warehouse.dialect == "postgresql":
        pytest.skip("the SQLite warehouse's message (the PostgreSQL pass runs the models)")
    from backfill_portal.backfills.models import BackfillRequest
    from backfill_portal.backfills.services.requests import backfill_request_create
    from backfill_portal.core.errors import ValidationError

    lines = sync_dbt(dbt_shop)
    assert "note: dbt models run only on a PostgreSQL warehouse (dbt-postgres): no dbt adapter " \
                        "works on the embedded SQLite warehouse; set WAREHOUSE_URL=postgresql://..." in lines
    with pytest.raises(ValidationError) as exc:
        backfill_request_create(actor=personas["alice"], job="orders", start="2022-10-01", end="2022-10-02",
                                reason="late orders")
    assert "no dbt adapter works on the embedded SQLite warehouse" in exc.value.fields["job"][0]
    assert not BackfillRequest.objects.exists()


def test_the_stale_page_of_a_fresh_dbt_job_lists_nothing_and_drafts_nothing(personas, dbt_shop):
    from django.test import Client
    from django.urls import reverse

    sync_dbt(dbt_shop)
    url = reverse("catalog-job-stale", args=["daily_sales"])
    assert Client().get(url)["Location"].startswith(reverse("login"))
    client = Client()
    client.force_login(personas["alice"])
    page = client.get(url).content.decode()
    assert "0 stale partitions" in page and "Draft a backfill" not in page
    answer = client.post(reverse("catalog-job-stale-draft", args=["daily_sales"]))
    assert answer.status_code == 400
    assert "no published partition was built by an older code version" in answer.content.decode()
    auditor = Client()
    auditor.force_login(personas["audrey"])  # who may not file a request is told so first
    assert auditor.post(reverse("catalog-job-stale-draft", args=["daily_sales"])).status_code == 403
    assert client.get(reverse("catalog-job-stale", args=["nope"])).status_code == 404
    assert "Built by older code" in client.get(reverse("catalog-job", args=["daily_sales"])).content.decode()


def test_an_unknown_draft_backfill_user_is_refused_before_anything_is_synced(personas, dbt_shop):
    """The exploratory test: with nothing stale the flag was never read, so a typo exited
    0 and said nothing."""
    with pytest.raises(CommandError) as exc:
        call_command("sync_dbt", str(dbt_shop), "--actor", "olivia", "--reason", SYNC_REASON,
                     "--draft-backfill", "nosuch")
    assert str(exc.value) == "--draft-backfill: 'nosuch' is not a user"
    assert not Dataset.objects.exists() and not AuditEvent.objects.filter(action__startswith="catalog.").exists()


def test_the_same_project_synced_from_another_directory_keeps_its_code_versions(personas, dbt_shop, tmp_path):
    """The exploratory test: the code version hashed where the project sat on disk, so a
    checkout per release made every dbt job a new version (every published partition
    stale, and --draft-backfill would file rebuilds of all of them)."""
    import shutil

    sync_dbt(dbt_shop)
    before = dict(Job.objects.filter(kind="dbt").values_list("name", "current_code_version__hash"))
    moved = tmp_path / "release-2" / "dbt_shop"
    shutil.copytree(dbt_shop, moved)
    lines = sync_dbt(moved)
    assert not [line for line in lines if "code version" in line], lines
    after = dict(Job.objects.filter(kind="dbt").values_list("name", "current_code_version__hash"))
    assert after == before and len(after) > 1
    # ... and its runs compile from where the project is now.
    for version in CodeVersion.objects.filter(job__kind="dbt", pk__in=Job.objects.values("current_code_version")):
        assert version.definition["dbt"]["project_dir"] == str(moved.resolve())
    # A change to a model is still a new version.
    model = next((moved / "models").rglob("*.sql"))
    model.write_text(model.read_text() + "\n-- changed\n")
    assert [line for line in sync_dbt(moved) if "code version" in line]


def test_dbt_never_gets_the_warehouse_password_in_a_file_and_its_scratch_directory_goes_with_the_process(
        dbt_shop, tmp_path):
    """The exploratory test: every sync_dbt left /tmp/bf-dbt-*/…/profiles.yml behind,
    holding the warehouse password in plain text."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = ("import django; django.setup()\n"
              "from pathlib import Path\n"
              "from backfill_portal.catalog import dbt_project\n"
              f"dbt_project.parse_project({str(dbt_shop)!r})\n"
              "files = [p for p in Path(%r).rglob('*') if p.is_file()]\n"
              "assert any(p.name == 'profiles.yml' for p in files), files\n"
              "assert not any(b'S3cretPw' in p.read_bytes() for p in files), 'the password is in a file'\n"
              "print('parsed')\n") % str(scratch)
    env = {**os.environ, "TMPDIR": str(scratch), "DJANGO_SETTINGS_MODULE": "backfill_portal.settings",
           "WAREHOUSE_URL": "postgresql://etl:S3cretPw@127.0.0.1:1/dw"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and "parsed" in done.stdout, done.stderr[-2000:]
    assert not list(scratch.glob("bf-dbt-*")), list(scratch.rglob("*"))[:5]  # removed at exit
