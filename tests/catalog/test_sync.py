"""Syncing the catalog file: idempotent, versioned, and all-or-nothing."""
from __future__ import annotations

import copy
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from backfill_portal.catalog.models import CodeVersion, Dataset, Job, Pool, Team
from backfill_portal.catalog.services.sync import CatalogError, catalog_sync
from backfill_portal.core.models import AuditEvent
from tests.conftest import TEST_CATALOG

BASE = yaml.safe_load(TEST_CATALOG)
DS = {d["name"]: i for i, d in enumerate(BASE["datasets"])}
JOBS = {j["name"]: i for i, j in enumerate(BASE["jobs"])}


def counts() -> dict[str, int]:
    return {m.__name__: m.objects.count() for m in (Team, Pool, Dataset, Job, CodeVersion, AuditEvent)}


def sync_command(path, *, actor: str = "olivia", reason: str = "deploy of the test catalog") -> str:
    out = StringIO()
    call_command("sync_catalog", str(path), "--actor", actor, "--reason", reason, stdout=out)
    return out.getvalue()


def write(tmp_path, text: str, name: str = "catalog.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def variant(mutate) -> str:
    doc = copy.deepcopy(BASE)
    mutate(doc)
    return yaml.safe_dump(doc, sort_keys=False)


def dataset(doc, name):
    return doc["datasets"][DS[name]]


def job(doc, name):
    return doc["jobs"][JOBS[name]]


# --- happy path --------------------------------------------------------------------------


def test_first_sync_creates_everything_and_prints_it(personas, tmp_path):
    out = sync_command(write(tmp_path, TEST_CATALOG))
    assert "created dataset dwd_order_items" in out
    assert "created job dwd_order_items" in out
    assert "created team core-data" in out
    assert Dataset.objects.count() == len(BASE["datasets"])
    assert Job.objects.count() == len(BASE["jobs"])
    assert CodeVersion.objects.count() == len(BASE["jobs"])
    assert all(j.current_code_version is not None for j in Job.objects.all())
    dwd = Job.objects.get(name="dwd_order_items")
    assert set(dwd.upstreams.values_list("name", flat=True)) == {"ods_order_events"}
    assert dwd.dataset.owner.username == "olivia"
    assert Dataset.objects.get(name="ods_order_events").is_source
    assert Job.objects.get(name="notify_finance").has_side_effects
    assert AuditEvent.objects.filter(action="catalog.create", object_type="dataset",
                                     object_id="dwd_order_items").count() == 1


def test_sync_is_idempotent(personas, tmp_path):
    path = write(tmp_path, TEST_CATALOG)
    sync_command(path)
    before = counts()
    out = sync_command(path)
    assert "0 created, 0 changed" in out
    assert "created " not in out.replace("0 created", "")
    assert counts() == before  # no new code versions, no audit rows for a no-op

    report = catalog_sync(text=TEST_CATALOG)
    assert (report.created, report.changed) == ([], [])
    assert counts() == before


def test_changed_sql_creates_a_new_code_version_and_keeps_the_old(personas, tmp_path):
    sync_command(write(tmp_path, TEST_CATALOG))
    dwd = Job.objects.get(name="dwd_order_items")
    old = dwd.current_code_version

    changed = TEST_CATALOG.replace("WHERE rn = 1", "WHERE rn = 1 AND amount IS NOT NULL")
    assert changed != TEST_CATALOG
    out = sync_command(write(tmp_path, changed, "changed.yaml"))
    assert "changed job dwd_order_items" in out
    assert f"code version {old.short_hash} ->" in out

    dwd.refresh_from_db()
    assert dwd.current_code_version_id != old.pk
    assert "amount IS NOT NULL" in dwd.current_code_version.definition["sql"]
    assert list(dwd.code_versions.order_by("id").values_list("pk", flat=True)) == [old.pk, dwd.current_code_version_id]
    assert CodeVersion.objects.count() == len(BASE["jobs"]) + 1  # only the changed job moved
    assert AuditEvent.objects.filter(action="catalog.code_version", object_id="dwd_order_items").count() == 2

    # Going back to the old text points at the old version again instead of minting a third.
    sync_command(write(tmp_path, TEST_CATALOG, "back.yaml"))
    dwd.refresh_from_db()
    assert dwd.current_code_version_id == old.pk
    assert CodeVersion.objects.count() == len(BASE["jobs"]) + 1


def test_changed_owner_is_synced_and_audited(personas, tmp_path):
    sync_command(write(tmp_path, TEST_CATALOG))
    text = variant(lambda d: dataset(d, "dws_sales_daily").update(owner="rita"))
    out = sync_command(write(tmp_path, text, "owner.yaml"))
    assert "changed dataset dws_sales_daily" in out
    assert Dataset.objects.get(name="dws_sales_daily").owner.username == "rita"
    event = AuditEvent.objects.filter(action="catalog.change", object_id="dws_sales_daily").get()
    assert event.data["before"]["owner"] == personas["sam"].pk
    assert event.data["after"]["owner"] == personas["rita"].pk


# --- bad catalogs: CommandError / CatalogError naming the path, nothing written --------------


def _cycle(d):
    job(d, "dwd_order_items")["reads"] = ["ods_order_events", "dws_sales_daily"]


def _sql(name, sql):
    return lambda d: job(d, name).update(sql=sql)


BAD_CATALOGS = {
    "cycle": (variant(_cycle), "jobs"),
    "job_reads_its_own_dataset": (variant(lambda d: job(d, "dws_sales_daily")["reads"].append("dws_sales_daily")), "jobs"),
    "dataset_without_owner": (variant(lambda d: dataset(d, "dws_sales_daily").pop("owner")),
                              f"datasets[{DS['dws_sales_daily']}].owner"),
    "owner_not_a_user": (variant(lambda d: dataset(d, "dws_sales_daily").update(owner="nobody")),
                         f"datasets[{DS['dws_sales_daily']}].owner"),
    "unknown_upstream": (variant(lambda d: job(d, "dws_sales_daily")["reads"].append("ghost_table")),
                         f"jobs[{JOBS['dws_sales_daily']}].reads"),
    "sql_uses_now": (variant(_sql("page_views_hourly", "SELECT 'home' AS page, 1 AS views, now() AS at")),
                     f"jobs[{JOBS['page_views_hourly']}].sql"),
    "sql_uses_current_date": (variant(_sql("page_views_hourly", "SELECT 'home' AS page, 1 AS views WHERE current_date > DATE '2000-01-01'")),
                              f"jobs[{JOBS['page_views_hourly']}].sql"),
    "sql_uses_random": (variant(_sql("page_views_hourly", "SELECT 'home' AS page, CAST(random() * 10 AS INTEGER) AS views")),
                        f"jobs[{JOBS['page_views_hourly']}].sql"),
    "sql_reads_undeclared_upstream": (variant(_sql("page_views_hourly",
                                                   "SELECT category AS page, 1 AS views FROM {{ ref('dwd_order_items') }} AS d")),
                                      f"jobs[{JOBS['page_views_hourly']}].sql"),
    "sql_reads_raw_table": (variant(_sql("page_views_hourly", "SELECT page, views FROM raw_page_views")),
                            f"jobs[{JOBS['page_views_hourly']}].sql"),
    "sql_is_insert": (variant(_sql("page_views_hourly", "INSERT INTO {{ this }} SELECT 'home' AS page, 1 AS views")),
                      f"jobs[{JOBS['page_views_hourly']}].sql", "SELECT"),
    "sql_is_delete": (variant(_sql("page_views_hourly", "DELETE FROM {{ this }}")),
                      f"jobs[{JOBS['page_views_hourly']}].sql", "SELECT"),
    "invalid_yaml": (TEST_CATALOG + "\n  - {name: broken, owner: [unclosed\n", "catalog"),
    "unknown_grain": (variant(lambda d: dataset(d, "monthly_summary").update(grain="week")),
                      f"datasets[{DS['monthly_summary']}].grain"),
    "bad_timezone": (variant(lambda d: dataset(d, "monthly_summary").update(timezone="Mars/Olympus_Mons")),
                     f"datasets[{DS['monthly_summary']}].timezone"),
    "business_key_not_a_column": (variant(lambda d: dataset(d, "dwd_order_items").update(business_key=["order_id", "sku"])),
                                  f"datasets[{DS['dwd_order_items']}].business_key"),
    # A file of another format, or a misspelt section, was read as "nothing declared".
    "another_version": (variant(lambda d: d.update(version=99)), "version", "catalog version 99 is not supported"),
    "misspelt_section": (variant(lambda d: d.update(dataset=d["datasets"])), "dataset", "unknown key"),
    # A tolerance that is no number was stored, and every verification of the dataset's
    # runs failed on it (they waited in `staged` for ever); YAML's `yes` was 1 attempt.
    "tolerance_not_a_number": (variant(lambda d: dataset(d, "dws_sales_daily").update(tolerances={"row_band": "abc"})),
                               f"datasets[{DS['dws_sales_daily']}].tolerances.row_band", "must be a number"),
    "tolerance_negative": (variant(lambda d: dataset(d, "dws_sales_daily").update(tolerances={"measure_rel": -1})),
                           f"datasets[{DS['dws_sales_daily']}].tolerances.measure_rel", "must be a number from 0"),
    "tolerance_switch_not_a_boolean": (
        variant(lambda d: dataset(d, "dws_sales_daily").update(tolerances={"row_band_blocking": "no"})),
        f"datasets[{DS['dws_sales_daily']}].tolerances.row_band_blocking", "true or false"),
    "tolerances_not_a_mapping": (variant(lambda d: dataset(d, "dws_sales_daily").update(tolerances=[1])),
                                 f"datasets[{DS['dws_sales_daily']}].tolerances"),
    "max_attempts_yes": (variant(lambda d: job(d, "dws_sales_daily").update(max_attempts=True)),
                         f"jobs[{JOBS['dws_sales_daily']}].max_attempts", "whole number"),
    "pool_slots_huge": (variant(lambda d: d["pools"][0].update(slots=10**23)), "pools[0].slots", "whole number"),
    "team_limit_yes": (variant(lambda d: d["teams"][0].update(max_concurrent_runs=True)),
                       "teams[0].max_concurrent_runs", "whole number"),
    "max_attempts_huge": (variant(lambda d: job(d, "dws_sales_daily").update(max_attempts=10**25)),
                          f"jobs[{JOBS['dws_sales_daily']}].max_attempts", "whole number"),
}


@pytest.mark.parametrize("case", list(BAD_CATALOGS))
def test_bad_catalog_is_refused_naming_the_path_and_writes_nothing(personas, tmp_path, case):
    text, path, *message = BAD_CATALOGS[case]
    # An existing catalog that the bad one would otherwise change.
    catalog_sync(text=TEST_CATALOG)
    before = counts()

    with pytest.raises(CommandError) as cmd_exc:
        sync_command(write(tmp_path, text))
    assert path in str(cmd_exc.value), str(cmd_exc.value)
    assert counts() == before

    with pytest.raises(CatalogError) as svc_exc:
        catalog_sync(text=text)
    assert path in svc_exc.value.fields, svc_exc.value.fields
    if message:
        assert message[0] in svc_exc.value.fields[path][0], svc_exc.value.fields[path]
    assert counts() == before


@pytest.mark.parametrize("case", ["cycle", "owner_not_a_user", "sql_uses_now"])
def test_bad_catalog_on_an_empty_database_writes_nothing(personas, tmp_path, case):
    text, path, *_ = BAD_CATALOGS[case]
    before = counts()
    with pytest.raises(CommandError) as exc:
        sync_command(write(tmp_path, text))
    assert path in str(exc.value)
    assert counts() == before
    assert Team.objects.count() == 0


WALL_CLOCK_SQL = {
    "sqlite_date_now": "SELECT 'home' AS page, 1 AS views WHERE date('now') > '2000-01-01'",
    "sqlite_datetime_now": "SELECT 'home' AS page, 1 AS views WHERE datetime('now', 'localtime') > '2000-01-01'",
    "sqlite_strftime_now": "SELECT 'home' AS page, CAST(strftime('%s', 'now') AS INTEGER) AS views",
    "sqlite_date_without_argument": "SELECT date() AS page, 1 AS views",
    "sqlite_unixepoch_without_argument": "SELECT 'home' AS page, unixepoch() AS views",
    "postgres_now_cast": "SELECT 'home' AS page, 1 AS views WHERE 'now'::timestamp > TIMESTAMP '2000-01-01'",
    "postgres_today_literal": "SELECT 'home' AS page, 1 AS views WHERE DATE 'today' > DATE '2000-01-01'",
    "current_timestamp": "SELECT 'home' AS page, 1 AS views WHERE CURRENT_TIMESTAMP > TIMESTAMP '2000-01-01'",
    "now_in_a_cte": "WITH t AS (SELECT now() AS at) SELECT 'home' AS page, 1 AS views FROM t",
    "randomblob": "SELECT hex(randomblob(4)) AS page, 1 AS views",
}


@pytest.mark.parametrize("case", list(WALL_CLOCK_SQL))
def test_template_reading_the_wall_clock_in_any_dialect_is_refused(personas, case):
    catalog_sync(text=TEST_CATALOG)
    before = counts()
    with pytest.raises(CatalogError) as exc:
        catalog_sync(text=variant(_sql("page_views_hourly", WALL_CLOCK_SQL[case])))
    path = f"jobs[{JOBS['page_views_hourly']}].sql"
    assert path in exc.value.fields, exc.value.fields
    assert "clock" in exc.value.fields[path][0] or "not allowed" in exc.value.fields[path][0]
    assert counts() == before


def test_template_computing_from_the_data_interval_is_accepted(personas):
    sql = ("SELECT strftime('%Y-%m-%d %H', {{ data_interval_start }}) AS page, 1 AS views "
           "WHERE date({{ data_interval_start }}) >= DATE '2000-01-01' AND 'now' <> 'today'")
    report = catalog_sync(text=variant(_sql("page_views_hourly", sql)))
    assert "job page_views_hourly" in report.created
    assert Job.objects.get(name="page_views_hourly").definition["sql"] == sql


def test_a_failure_while_writing_rolls_back_the_whole_sync(personas, monkeypatch):
    """Validation catches bad files; a crash half-way through the writes must not leave half a catalog."""
    from backfill_portal.catalog.services import sync

    real = sync.audit_record

    def failing(**kwargs):
        if kwargs["action"] == "catalog.code_version":
            raise RuntimeError("database went away")
        return real(**kwargs)

    monkeypatch.setattr(sync, "audit_record", failing)
    before = counts()
    with pytest.raises(RuntimeError):
        catalog_sync(text=TEST_CATALOG)
    assert counts() == before


def test_every_problem_is_reported_at_once(personas):
    def many(d):
        dataset(d, "monthly_summary")["grain"] = "week"
        dataset(d, "dws_sales_daily")["owner"] = "nobody"
        job(d, "page_views_hourly")["sql"] = "SELECT now() AS page, 1 AS views"

    with pytest.raises(CatalogError) as exc:
        catalog_sync(text=variant(many))
    assert {f"datasets[{DS['monthly_summary']}].grain", f"datasets[{DS['dws_sales_daily']}].owner",
            f"jobs[{JOBS['page_views_hourly']}].sql"} <= set(exc.value.fields)


def test_missing_file_is_a_command_error_naming_the_file(personas, tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(CommandError) as exc:
        sync_command(missing)
    assert str(missing) in str(exc.value)
    assert counts()["Dataset"] == 0


def test_a_sync_records_who_synced_and_why_on_every_audit_row(personas, tmp_path):
    sync_command(write(tmp_path, TEST_CATALOG), actor="olivia", reason="first deploy, ticket DATA-1")
    changed = TEST_CATALOG.replace("WHERE rn = 1", "WHERE rn = 1 AND amount > 0")
    assert changed != TEST_CATALOG
    sync_command(write(tmp_path, changed, "changed.yaml"), actor="sam", reason="drop refunds at zero, DATA-2")
    events = list(AuditEvent.objects.filter(action__startswith="catalog.").order_by("id"))
    assert events and all(e.actor_id is not None and e.reason for e in events)
    code = AuditEvent.objects.filter(action="catalog.code_version").order_by("-id").first()
    assert (code.actor.username, code.reason) == ("sam", "drop refunds at zero, DATA-2")
    summary = AuditEvent.objects.filter(action="catalog.sync").order_by("-id").first()
    assert summary.actor.username == "sam" and summary.object_id.endswith("changed.yaml")
    assert any("code version" in line for line in summary.data["changed"])


@pytest.mark.parametrize("args, message", [
    ((), "--actor is required"),
    (("--actor", "olivia"), "--reason is required"),
    (("--actor", "nobody", "--reason", "x"), "'nobody' is not an active portal user"),
    (("--actor", "olivia", "--reason", "deploy \x1b[2J"), "--reason: the control character U\\+001B is not allowed"),
])
def test_a_sync_without_who_or_why_is_refused_and_writes_nothing(personas, tmp_path, args, message):
    path = write(tmp_path, TEST_CATALOG)
    before = counts()
    with pytest.raises(CommandError, match=message):
        call_command("sync_catalog", str(path), *args, stdout=StringIO())
    assert counts() == before


def test_the_command_names_each_problem_once_and_a_file_that_is_not_utf8(personas, tmp_path):
    """The exploratory test: `first: version: …` was followed by the same `(version: …)`,
    and a file in another encoding was `UnicodeDecodeError` with no file name."""
    with pytest.raises(CommandError) as exc:
        sync_command(write(tmp_path, variant(lambda d: d.update(version=99))))
    assert str(exc.value).count("catalog version 99 is not supported") == 1, str(exc.value)
    path = tmp_path / "latin1.yaml"
    path.write_bytes("owner: \xe9".encode("latin-1"))
    with pytest.raises(CommandError) as exc:
        sync_command(path)
    assert str(path) in str(exc.value) and "not UTF-8" in str(exc.value), str(exc.value)
