from __future__ import annotations

import functools
from datetime import datetime, timezone as dt_timezone

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus, StepStatus
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, HandoffItem, Interval
from backfill_portal.backfills.policy import steps_decidable_by
from backfill_portal.core.errors import NotFound
from backfill_portal.core.roles import Role, has_role, stand_in_with_roles


def request_get(request_id) -> BackfillRequest:
    """The request, or NotFound (a 404 from the API and the pages alike), with what its
    services and pages read of it: the job, its dataset, owner, team and pool, the
    requester and the frozen code version."""
    try:
        return (BackfillRequest.objects
                .select_related("job__dataset__owner", "job__dataset__team", "job__pool", "requested_by",
                                "code_version")
                .get(pk=int(request_id)))
    except (BackfillRequest.DoesNotExist, ValueError, TypeError):
        raise NotFound(f"backfill request {request_id} does not exist") from None


def request_list(*, user=None, mine: bool = False) -> QuerySet[BackfillRequest]:
    # side_effects: the API's serializer lists them (one query a row without it).
    qs = (BackfillRequest.objects.select_related("job__dataset", "requested_by", "code_version")
          .prefetch_related("side_effects"))
    if mine and user is not None:
        qs = qs.filter(requested_by=user)
    return qs


# What a row of the request tables shows (the request_rows filter, web/templatetags/tables.py).
_ROW_FIELDS = ("id", "job__name", "first_partition", "last_partition", "interval_count", "status", "paused",
               "requested_by__username", "requested_at")


def request_rows(*, user=None, mine: bool = False) -> QuerySet[BackfillRequest]:
    """request_list for the pages' tables: only the columns a row shows, so the
    request's, the job's and the dataset's JSON columns are neither read nor decoded."""
    qs = BackfillRequest.objects.select_related("job", "requested_by").only(*_ROW_FIELDS)
    if mine and user is not None:
        qs = qs.filter(requested_by=user)
    return qs


def interval_counts(request: BackfillRequest, *, key_prefix: int, job_id: int | None = None,
                    within: str = "") -> list[tuple[int, str, str, int]]:
    """The request's intervals counted per (job, bucket, status), a bucket being the
    first `key_prefix` characters of the partition key (a local day of hourly
    partitions), in (job, bucket) order: [(job_id, bucket, status, count)]. `job_id`
    and `within` (a partition-key prefix) narrow it.

    One GROUP BY read through a plain cursor: a long request gives a row per (bucket,
    status), and the ORM's values(), with a converter per column, costs more per row
    than the query does."""
    table, qn = Interval._meta.db_table, connection.ops.quote_name
    where, params = [f"{qn('request_id')} = %s"], [key_prefix, request.pk]
    if job_id is not None:
        where.append(f"{qn('job_id')} = %s")
        params.append(job_id)
    if within:
        where.append(f"SUBSTR({qn('partition_key')}, 1, %s) = %s")
        params += [len(within), within]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {qn('job_id')}, SUBSTR({qn('partition_key')}, 1, %s), {qn('status')}, COUNT(*) "
                       f"FROM {qn(table)} WHERE {' AND '.join(where)} GROUP BY 1, 2, 3 ORDER BY 1, 2", params)
        return cursor.fetchall()


def request_progress(request: BackfillRequest) -> dict[str, int]:
    """Interval counts by status, from one aggregate query."""
    agg = Interval.objects.filter(request=request).aggregate(
        total=Count("id"),
        **{s: Count("id", filter=Q(status=s)) for s in IntervalStatus.values},
    )
    return agg


def request_intervals(request: BackfillRequest) -> QuerySet[Interval]:
    return Interval.objects.filter(request=request).select_related("job").order_by("job_id", "position")


def steps_waiting_for(user):
    """Pending steps this user may decide: theirs, or the admin steps when they are an
    admin. Never steps of their own requests (nobody approves their own request)."""
    return (ApprovalStep.objects.filter(steps_decidable_by(user), status=StepStatus.PENDING,
                                        request__status=RequestStatus.PENDING_APPROVAL)
            .select_related("request__job__dataset", "request__requested_by", "dataset", "job")
            .order_by("request_id", "id"))


def handoffs_waiting_for(user, *, now: datetime | None = None):
    """Hand-off items this user (a downstream owner) still has time to decide (at `now`);
    none once the user no longer holds the owner role (backfills.policy)."""
    if not has_role(user, Role.OWNER, Role.ADMIN):
        return HandoffItem.objects.none()
    return (HandoffItem.objects.filter(owner=user, status=HandoffItem.Status.PENDING,
                                       deadline__gte=now or timezone.now())
            .select_related("request__job__dataset", "request__requested_by", "job__dataset")
            .order_by("deadline", "id"))


def waiting_count(user) -> int:
    """How many approval steps and hand-off items wait for this user: the length of
    `steps_waiting_for` plus `handoffs_waiting_for`, in one statement (a UNION ALL of
    the two id lists, counted by the database).

    Every page's navigation shows it, so the statement is those two querysets' own
    SQL, compiled once per process (per database, for admins and for others) with
    stand-ins for the user and the time, put in their places on each call: compiling
    it took ~3-7 ms of every page, running it ~0.1 ms."""
    if not has_role(user, Role.OWNER, Role.ADMIN):
        return 0  # only owners (and admins) decide steps and hand-offs (backfills.policy)
    sql, params, user_slots, now_slots = _waiting_count_statement(connection.alias, has_role(user, Role.ADMIN))
    bound = list(params)
    now = _deadline_param(timezone.now())
    for i in user_slots:
        bound[i] = user.pk
    for i in now_slots:
        bound[i] = now
    with connection.cursor() as cursor:
        cursor.execute(sql, bound)
        return int(cursor.fetchone()[0])


# Stand-ins no real user id or time equals, found again among the compiled params.
_STAND_IN_USER = -7_351_002
_STAND_IN_NOW = datetime(1901, 2, 3, 4, 5, 6, 789, tzinfo=dt_timezone.utc)


def _deadline_param(value: datetime):
    return HandoffItem._meta.get_field("deadline").get_db_prep_value(value, connection, prepared=False)


@functools.lru_cache(maxsize=8)
def _waiting_count_statement(alias: str, admin: bool) -> tuple[str, tuple, tuple[int, ...], tuple[int, ...]]:
    """(sql, params, where the user's id goes, where the time goes) of `waiting_count`."""
    stand_in = stand_in_with_roles(get_user_model()(pk=_STAND_IN_USER), {Role.ADMIN} if admin else {Role.OWNER})
    steps = steps_waiting_for(stand_in).order_by().values_list("pk")
    handoffs = handoffs_waiting_for(stand_in, now=_STAND_IN_NOW).order_by().values_list("pk")
    inner, params = steps.union(handoffs, all=True).query.sql_with_params()
    now = _deadline_param(_STAND_IN_NOW)
    user_slots = tuple(i for i, p in enumerate(params) if p == _STAND_IN_USER)
    now_slots = tuple(i for i, p in enumerate(params) if p == now)
    if len(now_slots) != 1 or not user_slots:
        raise RuntimeError(f"waiting_count: the compiled statement's params are not as expected: {params!r}")
    return f"SELECT COUNT(*) FROM ({inner}) AS waiting", tuple(params), user_slots, now_slots
