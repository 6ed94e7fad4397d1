"""`load_demo` (most of a minute in `make run`) says what it is doing while it loads."""
from __future__ import annotations

from io import StringIO

from django.core.management import call_command


def load(*args) -> list[str]:
    out = StringIO()
    call_command("load_demo", "--first", "2022-09-29", "--last", "2022-10-02", "--orders-per-day", "20", *args,
                 stdout=out)
    return out.getvalue().splitlines()


def test_loading_prints_a_line_first_and_one_per_month_then_the_totals(db, warehouse):
    lines = [line for line in load() if line.startswith("source data:")]
    assert lines[0] == "source data: generating 8 table-days from 2022-09-29 to 2022-10-02 ..."
    assert lines[1].startswith("source data: 2022-09 loaded (") and lines[1].endswith(" rows so far)")
    assert lines[2].startswith("source data: 2022-10 loaded (")
    assert lines[3].startswith("source data: ods_order_events +")
    assert len(lines) == 4


def test_a_second_load_has_nothing_to_generate_and_says_only_the_totals(db, warehouse):
    load()
    lines = [line for line in load() if line.startswith("source data:")]
    assert len(lines) == 1 and "+0" in lines[0]


def test_the_story_is_not_told_over_source_data_that_does_not_cover_its_history(db, warehouse):
    from backfill_portal.backfills.models import BackfillRequest
    from backfill_portal.execution.models import Run

    lines = [line for line in load() if line.startswith("story:")]
    assert lines == ["story: not told: the source data lacks 174 day(s) of 2022-09-01 .. 2022-11-30 "
                     "(load them with --first/--last)"]
    assert not BackfillRequest.objects.exists() and not Run.objects.exists()


def test_bad_arguments_are_one_line_before_anything_is_written(db, warehouse):
    """The exploratory tests: a reversed range or a date with no day after it failed with
    a ValueError/OverflowError only after the users and the catalog were written, and a
    negative scale was accepted."""
    import pytest
    from django.contrib.auth.models import User
    from django.core.management import CommandError

    from backfill_portal.catalog.models import Dataset

    for args, message in ((("--first", "2022-12-01", "--last", "2022-01-01"), "--last 2022-01-01 is before --first"),
                          (("--first", "9999-12-31", "--last", "9999-12-31"), "the demo's days are from 1900 to 9998"),
                          (("--first", "0001-01-01", "--last", "0001-01-02"), "the demo's days are from 1900 to 9998"),
                          (("--orders-per-day", "-5"), "--orders-per-day must be from 1 to 200,000, not -5"),
                          # 22 GB before the kernel killed it (the exploratory test):
                          (("--orders-per-day", "99999999999999999999"), "--orders-per-day must be from 1 to 200,000"),
                          (("--page-views-per-hour", "20001"), "--page-views-per-hour must be from 1 to 20,000"),
                          (("--first", "2012-01-01", "--last", "2021-12-31", "--orders-per-day", "200000"),
                           "the demo makes at most 50,000,000"),
                          (("--first", "nope"), "--first/--last: Invalid isoformat string")):
        with pytest.raises(CommandError) as exc:
            call_command("load_demo", *args, stdout=StringIO())
        assert message in str(exc.value), args
    assert not User.objects.exists() and not Dataset.objects.exists()
