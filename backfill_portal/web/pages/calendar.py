"""The calendar page of one request: the whole calendar on the screen's width, and the
calendar of one bucket (a job and a partition-key prefix) that an aggregated cell opens."""
from __future__ import annotations

import re

from django.contrib.auth.decorators import login_required

from backfill_portal.backfills.selectors import request_get
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ValidationError
from backfill_portal.core.web import application_errors, render_page
from backfill_portal.web.calendar_grid import request_calendar

# A partition-key prefix: a year, a month, a day, or a day and hour.
WITHIN = re.compile(r"\d{4}(-\d{2}(-\d{2}(T\d{2})?)?)?")


@login_required
@application_errors
def request_calendar_page(request, pk: int):
    req = request_get(pk)
    within = request.GET.get("within", "").strip()
    if within and not WITHIN.fullmatch(within):
        raise ValidationError(f"within={within[:40]!r} is not a partition-key prefix such as 2022, 2022-10 or "
                              "2022-10-01", field="within")
    name = request.GET.get("job", "").strip()
    job = None
    if name:
        names = {req.job.name, *(req.node_actions or {})}
        job = Job.objects.filter(name=name).first() if name in names else None
        if job is None:
            raise ValidationError(f"job {name[:80]!r} is not part of request #{req.pk}", field="job")
    return render_page(request, "backfills/calendar.html", {
        "req": req, "calendar": request_calendar(req, job=job, within=within), "within": within, "job": job,
    })
