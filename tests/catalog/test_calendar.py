"""The interval planner: local-time partitions, exact UTC intervals, DST never hidden."""
from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from backfill_portal.catalog.calendar import (
    PlannedInterval,
    dst_notes,
    first_unended,
    interval_for_key,
    offset_matters,
    parse_partition,
    partition_for,
    plan_intervals,
    previous_partition,
)
from backfill_portal.core.errors import ValidationError

NY = "America/New_York"
LONDON = "Europe/London"
SHANGHAI = "Asia/Shanghai"
KOLKATA = "Asia/Kolkata"
H = timedelta(hours=1)


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def assert_contiguous(intervals: list[PlannedInterval]) -> None:
    for iv in intervals:
        assert iv.start < iv.end
        assert iv.start.utcoffset() == timedelta(0) and iv.end.utcoffset() == timedelta(0)
    for a, b in zip(intervals, intervals[1:]):
        assert a.end == b.start, (a, b)
    keys = [iv.partition_key for iv in intervals]
    assert len(keys) == len(set(keys))


def refusal(field: str, **kwargs) -> ValidationError:
    """Plan with kwargs, expect a refusal naming exactly `field`, and return it."""
    with pytest.raises(ValidationError) as exc:
        plan_intervals(**kwargs)
    assert list(exc.value.fields) == [field], exc.value.fields
    return exc.value


# --- Asia/Shanghai: no DST, the business day starts at 16:00 UTC the day before ---------


def test_shanghai_day_starts_at_1600_utc_the_previous_day():
    [iv] = plan_intervals(grain="day", timezone=SHANGHAI, first="2022-10-01", last="2022-10-01")
    assert iv.partition_key == "2022-10-01"
    assert (iv.start, iv.end) == (utc(2022, 9, 30, 16), utc(2022, 10, 1, 16))


def test_shanghai_october_is_31_contiguous_24_hour_days():
    ivs = plan_intervals(grain="day", timezone=SHANGHAI, first="2022-10-01", last="2022-10-31")
    assert len(ivs) == 31
    assert_contiguous(ivs)
    assert all(iv.hours == 24 for iv in ivs)
    assert ivs[0].partition_key == "2022-10-01" and ivs[-1].partition_key == "2022-10-31"
    assert ivs[-1].end == utc(2022, 10, 31, 16)
    assert dst_notes(ivs) == []


def test_equal_first_and_last_is_one_interval():
    assert len(plan_intervals(grain="month", timezone=SHANGHAI, first="2022-10", last="2022-10")) == 1
    assert len(plan_intervals(grain="hour", timezone=SHANGHAI, first="2022-10-01T00:00Z",
                              last="2022-10-01T00:00Z")) == 1


def test_day_bounds_accept_date_objects_and_local_midnight_datetimes():
    by_str = plan_intervals(grain="day", timezone=SHANGHAI, first="2022-10-01", last="2022-10-03")
    by_date = plan_intervals(grain="day", timezone=SHANGHAI, first=date(2022, 10, 1), last=date(2022, 10, 3))
    by_naive = plan_intervals(grain="day", timezone=SHANGHAI, first=datetime(2022, 10, 1), last=datetime(2022, 10, 3))
    by_aware = plan_intervals(grain="day", timezone=SHANGHAI, first=utc(2022, 9, 30, 16),
                              last=datetime(2022, 10, 3, tzinfo=ZoneInfo(SHANGHAI)))
    assert by_str == by_date == by_naive == by_aware


def test_parse_partition_returns_the_local_start_of_the_partition():
    start = parse_partition(grain="day", timezone=NY, value="2022-11-06", field="start")
    assert start == datetime(2022, 11, 6, tzinfo=ZoneInfo(NY))
    assert start.utcoffset() == timedelta(hours=-4)
    hour = parse_partition(grain="hour", timezone=NY, value="2022-11-06T06:00Z", field="start")
    assert hour.isoformat() == "2022-11-06T01:00:00-05:00"


# --- America/New_York: 2022-03-13 springs forward, 2022-11-06 falls back -------------------


def test_new_york_spring_forward_day_is_23_hours():
    before, day, after = plan_intervals(grain="day", timezone=NY, first="2022-03-12", last="2022-03-14")
    assert (before.hours, day.hours, after.hours) == (24, 23, 24)
    assert (day.start, day.end) == (utc(2022, 3, 13, 5), utc(2022, 3, 14, 4))
    assert "23-hour day" in day.note and before.note == ""


def test_new_york_fall_back_day_is_25_hours():
    [day] = plan_intervals(grain="day", timezone=NY, first="2022-11-06", last="2022-11-06")
    assert day.hours == 25
    assert (day.start, day.end) == (utc(2022, 11, 6, 4), utc(2022, 11, 7, 5))
    assert dst_notes([day]) == ["2022-11-06: 25-hour day (clocks go back; normally 24 hours)"]


def test_new_york_fall_back_hourly_has_25_partitions_with_two_distinct_0100_keys():
    ivs = plan_intervals(grain="hour", timezone=NY, first="2022-11-06T00:00-04:00", last="2022-11-06T23:00-05:00")
    assert len(ivs) == 25
    assert_contiguous(ivs)
    keys = [iv.partition_key for iv in ivs]
    assert keys[:4] == ["2022-11-06T00:00-04:00", "2022-11-06T01:00-04:00",
                        "2022-11-06T01:00-05:00", "2022-11-06T02:00-05:00"]
    assert [k for k in keys if "T01:00" in k] == ["2022-11-06T01:00-04:00", "2022-11-06T01:00-05:00"]
    assert ivs[1].start == utc(2022, 11, 6, 5) and ivs[2].start == utc(2022, 11, 6, 6)
    notes = dst_notes(ivs)
    assert notes == ["2022-11-06T01:00-04:00: repeated local hour 01:00 EDT (first occurrence)",
                     "2022-11-06T01:00-05:00: repeated local hour 01:00 EST (second occurrence)"]


def test_new_york_spring_forward_hourly_has_23_partitions_and_no_0200():
    ivs = plan_intervals(grain="hour", timezone=NY, first="2022-03-13T00:00-05:00", last="2022-03-13T23:00-04:00")
    assert len(ivs) == 23
    assert_contiguous(ivs)
    keys = [iv.partition_key for iv in ivs]
    assert not any("T02:" in k for k in keys)
    assert keys[1:3] == ["2022-03-13T01:00-05:00", "2022-03-13T03:00-04:00"]
    assert dst_notes(ivs) == ["2022-03-13T01:00-05:00: clocks go forward: local 01:00 EST to 03:00 EDT is one real hour"]


@pytest.mark.parametrize("day", ["2022-03-13", "2022-11-06", "2022-07-01"])
def test_new_york_hours_of_a_local_day_tile_exactly_the_daily_interval(day):
    [whole] = plan_intervals(grain="day", timezone=NY, first=day, last=day)
    first = partition_for(grain="hour", timezone=NY, at=whole.start)
    last = partition_for(grain="hour", timezone=NY, at=whole.end - H)
    hours = plan_intervals(grain="hour", timezone=NY, first=first.partition_key, last=last.partition_key)
    assert (hours[0].start, hours[-1].end) == (whole.start, whole.end)
    assert len(hours) == whole.hours


def test_hourly_bound_may_use_utc_or_the_zones_offset_for_the_same_instant():
    a = plan_intervals(grain="hour", timezone=NY, first="2022-11-06T06:00Z", last="2022-11-06T07:00+00:00")
    b = plan_intervals(grain="hour", timezone=NY, first="2022-11-06T01:00-05:00",
                       last=datetime(2022, 11, 6, 2, tzinfo=ZoneInfo(NY)))
    assert a == b
    assert [iv.partition_key for iv in a] == ["2022-11-06T01:00-05:00", "2022-11-06T02:00-05:00"]


@pytest.mark.parametrize(("given", "there"), [("2022-10-05T01:00+05:00", "2022-10-04T16:00:00-04:00"),
                                             ("2022-10-05T01:00-05:00", "2022-10-05T02:00:00-04:00")])
def test_an_hourly_bound_with_another_zones_offset_is_refused_naming_the_hour_it_would_be(given, there):
    """The form asks for the dataset zone's local hour: +05:00 for -05:00, or winter's
    offset in summer, would quietly back-fill another hour or day."""
    with pytest.raises(ValidationError, match=f"that instant is {there} there") as caught:
        plan_intervals(grain="hour", timezone=NY, first=given, last="2022-10-05T03:00-04:00")
    assert list(caught.value.fields) == ["start"]


# --- Europe/London: 2022-03-27 and 2022-10-30 ------------------------------------------------


def test_london_spring_and_autumn_days_are_23_and_25_hours():
    ivs = {iv.partition_key: iv for iv in plan_intervals(grain="day", timezone=LONDON,
                                                         first="2022-01-01", last="2022-12-31")}
    assert len(ivs) == 365
    assert ivs["2022-03-27"].hours == 23 and ivs["2022-10-30"].hours == 25
    assert sum(iv.hours for iv in ivs.values()) == 365 * 24
    assert [k for k, iv in ivs.items() if iv.hours != 24] == ["2022-03-27", "2022-10-30"]
    assert ivs["2022-07-01"].start == utc(2022, 6, 30, 23)  # BST midnight


def test_london_spring_hourly_skips_0100():
    ivs = plan_intervals(grain="hour", timezone=LONDON, first="2022-03-27T00:00Z", last="2022-03-27T22:00Z")
    assert len(ivs) == 23
    keys = [iv.partition_key for iv in ivs]
    assert keys[:2] == ["2022-03-27T00:00+00:00", "2022-03-27T02:00+01:00"]
    assert not any("T01:" in k for k in keys)
    assert keys[-1] == "2022-03-27T23:00+01:00"


def test_london_autumn_hourly_repeats_0100_with_distinct_keys():
    ivs = plan_intervals(grain="hour", timezone=LONDON, first="2022-10-30T00:00+01:00", last="2022-10-30T23:00+00:00")
    assert len(ivs) == 25
    assert_contiguous(ivs)
    keys = [iv.partition_key for iv in ivs]
    assert [k for k in keys if "T01:00" in k] == ["2022-10-30T01:00+01:00", "2022-10-30T01:00+00:00"]
    assert len(dst_notes(ivs)) == 2


# --- Non-whole-hour offsets and odd zones --------------------------------------------------


def test_kolkata_hourly_partitions_are_utc_hours_shown_at_half_past_local():
    ivs = plan_intervals(grain="hour", timezone=KOLKATA, first="2022-10-01T05:30+05:30", last="2022-10-01T07:30+05:30")
    assert [iv.partition_key for iv in ivs] == ["2022-10-01T05:30+05:30", "2022-10-01T06:30+05:30",
                                                "2022-10-01T07:30+05:30"]
    assert ivs[0].start == utc(2022, 10, 1, 0)


def test_kolkata_hourly_bound_on_the_local_hour_is_not_a_partition_start():
    err = refusal("start", grain="hour", timezone=KOLKATA, first="2022-10-01T05:00+05:30",
                  last="2022-10-01T07:30+05:30")
    assert "not the start of an hourly partition" in err.message


def test_kolkata_day_is_cut_at_local_midnight():
    [iv] = plan_intervals(grain="day", timezone=KOLKATA, first="2022-10-01", last="2022-10-01")
    assert (iv.start, iv.end) == (utc(2022, 9, 30, 18, 30), utc(2022, 10, 1, 18, 30))


def test_sao_paulo_day_whose_midnight_was_skipped_starts_at_the_first_real_instant():
    # 2018-11-04 00:00 did not exist there: clocks went from 23:59:59 -03 to 01:00 -02.
    [iv] = plan_intervals(grain="day", timezone="America/Sao_Paulo", first="2018-11-04", last="2018-11-04")
    assert iv.start == utc(2018, 11, 4, 3) and iv.hours == 23
    assert "23-hour day" in iv.note


def test_a_day_that_never_existed_locally_is_not_planned():
    # Pacific/Apia jumped from 2011-12-29 straight to 2011-12-31.
    ivs = plan_intervals(grain="day", timezone="Pacific/Apia", first="2011-12-29", last="2011-12-31")
    assert [iv.partition_key for iv in ivs] == ["2011-12-29", "2011-12-31"]
    assert_contiguous(ivs)
    refusal("start", grain="day", timezone="Pacific/Apia", first="2011-12-30", last="2011-12-31")


# --- Month grain -------------------------------------------------------------------------


def test_february_2024_is_29_days():
    [feb] = plan_intervals(grain="month", timezone=SHANGHAI, first="2024-02", last="2024-02")
    assert feb.partition_key == "2024-02"
    assert (feb.start, feb.end) == (utc(2024, 1, 31, 16), utc(2024, 2, 29, 16))
    assert feb.hours == 29 * 24


def test_months_of_2022_are_12_contiguous_intervals_of_real_length():
    ivs = plan_intervals(grain="month", timezone=SHANGHAI, first="2022-01", last="2022-12")
    assert [iv.partition_key for iv in ivs] == [f"2022-{m:02d}" for m in range(1, 13)]
    assert_contiguous(ivs)
    assert [iv.hours / 24 for iv in ivs] == [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    assert ivs[-1].end == utc(2022, 12, 31, 16)


def test_new_york_march_2022_is_31_days_minus_one_hour():
    ivs = plan_intervals(grain="month", timezone=NY, first="2022-03", last="2022-03")
    assert ivs[0].hours == 31 * 24 - 1
    assert (ivs[0].start, ivs[0].end) == (utc(2022, 3, 1, 5), utc(2022, 4, 1, 4))
    assert dst_notes(ivs) == ["2022-03: 743-hour month (clocks go forward; normally 744 hours)"]


def test_new_york_november_2022_is_30_days_plus_one_hour():
    [nov] = plan_intervals(grain="month", timezone=NY, first="2022-11-01", last=date(2022, 11, 1))
    assert nov.hours == 30 * 24 + 1


def test_month_range_crosses_the_year_end():
    ivs = plan_intervals(grain="month", timezone=NY, first="2022-11", last="2023-02")
    assert [iv.partition_key for iv in ivs] == ["2022-11", "2022-12", "2023-01", "2023-02"]
    assert_contiguous(ivs)


# --- Refusals: each names the request field the user got wrong -------------------------------


def test_last_before_first_is_refused_on_end():
    err = refusal("end", grain="day", timezone=SHANGHAI, first="2022-10-31", last="2022-10-01")
    assert err.message == "last partition '2022-10-01' is before first partition '2022-10-31'"
    refusal("end", grain="hour", timezone=NY, first="2022-11-06T01:00-05:00", last="2022-11-06T01:00-04:00")


@pytest.mark.parametrize("bad", ["2022-13-01", "2022-02-30", "yesterday", "20221001", "2022-10-1", ""])
def test_unparseable_day_is_refused_with_the_value_quoted(bad):
    err = refusal("start", grain="day", timezone=SHANGHAI, first=bad, last="2022-10-31")
    assert repr(bad) in err.message


def test_unparseable_last_partition_is_refused_on_end():
    err = refusal("end", grain="month", timezone=SHANGHAI, first="2022-01", last="2022/12")
    assert "'2022/12'" in err.message


@pytest.mark.parametrize("naive", ["2022-11-06T01:00", "2022-11-06", datetime(2022, 11, 6, 1)])
def test_naive_hourly_value_is_refused_because_the_hour_may_repeat(naive):
    err = refusal("start", grain="hour", timezone=NY, first=naive, last="2022-11-06T05:00Z")
    assert "offset" in err.message and "twice" in err.message


@pytest.mark.parametrize("value", ["2022-11-06T01:30-04:00", "2022-11-06T01:00:05-04:00", "2022-11-06T01:00:00.5Z"])
def test_hourly_value_off_the_hour_is_refused(value):
    refusal("end", grain="hour", timezone=NY, first="2022-11-06T00:00-04:00", last=value)


def test_date_object_for_hourly_grain_is_refused():
    refusal("start", grain="hour", timezone=NY, first=date(2022, 11, 6), last="2022-11-06T05:00Z")


@pytest.mark.parametrize("value", ["2022-03-15", date(2022, 3, 15)])
def test_month_value_not_on_the_first_is_refused(value):
    err = refusal("start", grain="month", timezone=NY, first=value, last="2022-12")
    assert "not the first day of a month" in err.message


@pytest.mark.parametrize("value", ["2022-3", "2022-03-32", "March 2022"])
def test_unparseable_month_is_refused(value):
    refusal("start", grain="month", timezone=NY, first=value, last="2022-12")


def test_day_datetime_that_is_not_local_midnight_is_refused():
    refusal("start", grain="day", timezone=SHANGHAI, first=utc(2022, 10, 1), last="2022-10-31")
    refusal("start", grain="day", timezone=SHANGHAI, first=datetime(2022, 10, 1, 12), last="2022-10-31")


@pytest.mark.parametrize("tz", ["Mars/Olympus_Mons", "", "../../etc/passwd", "EST5EDT "])
def test_unknown_timezone_is_refused(tz):
    refusal("timezone", grain="day", timezone=tz, first="2022-10-01", last="2022-10-31")


@pytest.mark.parametrize("grain", ["week", "Day", "", "minute"])
def test_unknown_grain_is_refused(grain):
    refusal("grain", grain=grain, timezone=SHANGHAI, first="2022-10-01", last="2022-10-31")


def test_range_over_the_limit_is_refused_with_the_count():
    err = refusal("end", grain="day", timezone=SHANGHAI, first="2022-10-01", last="2022-10-31", limit=30)
    assert err.message == "this range has 31 intervals; the limit is 30; split the request"
    assert len(plan_intervals(grain="day", timezone=SHANGHAI, first="2022-10-01", last="2022-10-31", limit=31)) == 31


def test_hourly_limit_counts_real_hours_across_fall_back():
    refusal("end", grain="hour", timezone=NY, first="2022-11-06T00:00-04:00", last="2022-11-06T23:00-05:00", limit=24)


def test_first_unended_is_the_first_interval_whose_end_is_after_now():
    ivs = plan_intervals(grain="day", timezone=SHANGHAI, first="2022-10-01", last="2022-10-03")
    assert first_unended(ivs, now=utc(2022, 10, 4)) is None  # every one has ended
    assert first_unended(ivs, now=utc(2022, 10, 3, 16)) is None  # [start, end): ended at its end
    assert first_unended(ivs, now=utc(2022, 10, 3, 15, 59, 59)).partition_key == "2022-10-03"
    assert first_unended(ivs, now=utc(2022, 10, 1, 17)).partition_key == "2022-10-02"
    assert first_unended(ivs, now=utc(2000, 1, 1)).partition_key == "2022-10-01"  # all in the future
    assert first_unended([], now=utc(2022, 10, 1)) is None


def test_huge_range_is_refused_before_it_is_built():
    # 61 million hourly intervals: building them first would exhaust the test's memory and time.
    err = refusal("end", grain="hour", timezone=NY, first="2000-01-01T00:00Z", last="9000-01-01T00:00Z", limit=1000)
    assert "split the request" in err.message


# --- Keys round-trip; previous partitions cross DST, month and year ends ---------------------

ROUND_TRIP_RANGES = [
    ("hour", NY, "2022-11-05T22:00-04:00", "2022-11-06T04:00-05:00"),
    ("hour", NY, "2022-03-12T22:00-05:00", "2022-03-13T05:00-04:00"),
    ("hour", LONDON, "2022-10-29T22:00Z", "2022-10-30T04:00Z"),
    ("hour", KOLKATA, "2022-12-31T20:30+05:30", "2023-01-01T03:30+05:30"),
    ("hour", "UTC", "2023-12-31T21:00Z", "2024-01-01T02:00Z"),
    ("day", NY, "2022-03-11", "2022-03-15"),
    ("day", LONDON, "2022-10-28", "2022-11-01"),
    ("day", SHANGHAI, "2023-12-30", "2024-03-02"),
    ("month", NY, "2021-10", "2023-04"),
    ("month", SHANGHAI, "2023-11", "2024-03"),
]


@pytest.mark.parametrize(("grain", "tz", "first", "last"), ROUND_TRIP_RANGES)
def test_every_key_round_trips_and_points_back_to_its_predecessor(grain, tz, first, last):
    ivs = plan_intervals(grain=grain, timezone=tz, first=first, last=last)
    assert_contiguous(ivs)
    for i, iv in enumerate(ivs):
        assert interval_for_key(grain=grain, timezone=tz, partition_key=iv.partition_key) == iv
        assert partition_for(grain=grain, timezone=tz, at=iv.start) == iv
        assert partition_for(grain=grain, timezone=tz, at=iv.end - timedelta(microseconds=1)) == iv
        if i:
            assert previous_partition(grain=grain, timezone=tz, partition_key=iv.partition_key) == ivs[i - 1].partition_key


@pytest.mark.parametrize(("grain", "tz", "key", "previous"), [
    ("hour", NY, "2022-11-06T01:00-05:00", "2022-11-06T01:00-04:00"),
    ("hour", NY, "2022-11-06T02:00-05:00", "2022-11-06T01:00-05:00"),
    ("hour", NY, "2022-03-13T03:00-04:00", "2022-03-13T01:00-05:00"),
    ("hour", SHANGHAI, "2023-01-01T00:00+08:00", "2022-12-31T23:00+08:00"),
    ("day", NY, "2022-03-14", "2022-03-13"),
    ("day", SHANGHAI, "2023-01-01", "2022-12-31"),
    ("day", SHANGHAI, "2024-03-01", "2024-02-29"),
    ("month", NY, "2023-01", "2022-12"),
    ("month", NY, "2022-04", "2022-03"),
])
def test_previous_partition(grain, tz, key, previous):
    assert previous_partition(grain=grain, timezone=tz, partition_key=key) == previous


@pytest.mark.parametrize(("grain", "key"), [
    ("hour", "2022-11-06T01:00"),  # no offset: which 01:00?
    ("hour", "2022-11-06T01:00-07:00"),  # a real instant, but not New York's offset then
    ("hour", "2022-03-13T02:00-05:00"),  # the skipped spring hour
    ("hour", "2022-11-06T01:30-04:00"),
    ("hour", "2022-11-06 01:00-04:00"),
    ("day", "2022-1-5"),
    ("day", "2022-02-30"),
    ("month", "2022-03-01"),  # accepted as a request bound, but not a canonical key
    ("month", "2022-13"),
    ("month", None),
])
def test_malformed_or_impossible_key_is_refused_on_partition(grain, key):
    with pytest.raises(ValidationError) as exc:
        interval_for_key(grain=grain, timezone=NY, partition_key=key)
    assert list(exc.value.fields) == ["partition"]


def test_partition_for_finds_the_repeated_hour_and_the_shanghai_day():
    assert partition_for(grain="hour", timezone=NY, at=utc(2022, 11, 6, 6, 30)).partition_key == "2022-11-06T01:00-05:00"
    assert partition_for(grain="hour", timezone=NY, at=utc(2022, 11, 6, 5, 59)).partition_key == "2022-11-06T01:00-04:00"
    assert partition_for(grain="day", timezone=SHANGHAI, at=utc(2022, 10, 1, 15, 59)).partition_key == "2022-10-01"
    assert partition_for(grain="day", timezone=SHANGHAI, at=utc(2022, 10, 1, 16)).partition_key == "2022-10-02"
    assert partition_for(grain="month", timezone=SHANGHAI, at=utc(2022, 12, 31, 16)).partition_key == "2023-01"


def test_partition_for_a_naive_instant_is_a_programming_error():
    with pytest.raises(ValueError):
        partition_for(grain="day", timezone=SHANGHAI, at=datetime(2022, 10, 1))


# --- Scale ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tz", ["UTC", NY])
def test_three_years_hourly_plans_26304_contiguous_intervals(tz):
    expected = (date(2023, 1, 1) - date(2020, 1, 1)).days * 24  # 366 + 365 + 365 days; 2020 is a leap year
    assert expected == 26_304
    ivs = plan_intervals(grain="hour", timezone=tz, first="2020-01-01T00:00Z", last="2022-12-31T23:00Z")
    assert len(ivs) == expected
    assert_contiguous(ivs)
    assert (ivs[0].start, ivs[-1].end) == (utc(2020, 1, 1), utc(2023, 1, 1))


def test_only_hours_where_the_clocks_change_need_their_offset_to_be_told_apart():
    fall = [iv.partition_key for iv in plan_intervals(grain="hour", timezone=NY, first="2022-11-06T00:00-04:00",
                                                        last="2022-11-06T03:00-05:00")]
    assert [k for k in fall if offset_matters(timezone=NY, partition_key=k)] == [
        "2022-11-06T01:00-04:00", "2022-11-06T01:00-05:00"]
    spring = [iv.partition_key for iv in plan_intervals(grain="hour", timezone=NY, first="2023-03-12T00:00-05:00",
                                                          last="2023-03-12T04:00-04:00")]
    assert [k for k in spring if offset_matters(timezone=NY, partition_key=k)] == [
        "2023-03-12T01:00-05:00", "2023-03-12T03:00-04:00"]
    assert not offset_matters(timezone=SHANGHAI, partition_key="2022-11-06T01:00+08:00")
