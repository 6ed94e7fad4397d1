"""Server-side set-ups for the browser journeys, through the same services the pages
call (what happened before the person in the journey opened their browser)."""
from __future__ import annotations

from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request


def doubled_incident(personas, queue, *, good_range=("2022-09-28", "2022-10-03"), bad_range=("2022-10-01", "2022-10-03"),
                     with_consumer: bool = False):
    """The 2 a.m. incident: a good backfill, then a code change that doubles every row
    backfilled over part of it (all runs green), then the fix deployed again.
    With `with_consumer`, dws_sales_daily is rebuilt on the doubled version."""
    deploy()
    good = run_request(personas, queue, start=good_range[0], end=good_range[1])
    deploy(dwd_sql=DOUBLED_SQL)
    bad = run_request(personas, queue, start=bad_range[0], end=bad_range[1])
    deploy()
    dws = None
    if with_consumer:
        dws = run_request(personas, queue, job="dws_sales_daily", start=bad_range[0], end=bad_range[1],
                          approver="sam")
    return good, bad, dws
