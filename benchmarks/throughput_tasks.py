"""The bare side of benchmarks/throughput.py: one Celery task per interval that runs the
warehouse statements the portal runs for that interval, through the same backend
interface, and nothing else: no run, attempt, audit row, outbox row, pin or check
record in the metadata database, no dispatch. The benchmark's worker loads it beside
the portal's tasks (`celery -A backfill_portal worker --include throughput_tasks`), so
both sides run on the same worker processes and the same broker.

Per interval, as the portal's path does: the source watermark (COUNT, MAX(ingested_at)
over the source interval), the output's columns, staging with its commit marker (the
numbers and the fingerprint), the catalog's assertion over the staged version, the
current pointer, and the compare-and-set publication. Then the finish time goes to a
Redis list that the benchmark reads.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from datetime import datetime

import jinja2
import redis
from celery import shared_task
from django.conf import settings

BARE_PREFIX = "bare_"


@functools.cache
def _job(job_name: str):
    """The job's frozen template, its source and its dataset's spec under a name of the
    bare side's own (so the two sides never share a pointer). Read once per process."""
    from backfill_portal.backends import get_warehouse
    from backfill_portal.catalog.models import Job
    from backfill_portal.catalog.specs import spec_for

    job = Job.objects.select_related("dataset", "current_code_version").get(name=job_name)
    source = job.upstreams.get()
    spec = dataclasses.replace(spec_for(job.dataset), name=BARE_PREFIX + job.dataset.name)
    get_warehouse().ensure_dataset(spec)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    template = env.from_string(job.current_code_version.definition["sql"])
    checks = [env.from_string(c["sql"]) for c in job.dataset.checks or []]
    return template, source.name, source.time_column, spec, checks


@functools.cache
def _redis():
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


@shared_task(name="bench.bare_interval", acks_late=True)
def bare_interval(run_id: str, partition: str, start: str, end: str, done_key: str) -> None:
    from backfill_portal.backends import get_warehouse
    from backfill_portal.execution.checks.assertions import failing_rows

    template, source, time_column, spec, checks = _job("dwd_page_views_hourly")
    warehouse = get_warehouse()
    src = warehouse.source_sql(name=source, time_column=time_column,
                               start=datetime.fromisoformat(start), end=datetime.fromisoformat(end))
    warehouse.query(f'SELECT COUNT(*), MAX("ingested_at"), NULL FROM {src} AS s')
    sql = template.render(partition_key="'" + partition.replace("'", "''") + "'", ref=lambda name: src)
    warehouse.columns_of(sql)
    warehouse.stage_select(spec=spec, run_id=run_id, attempt_no=1, partition=partition, select_sql=sql, take_over=True)
    this = warehouse.ref_sql(spec=spec, pins={partition: run_id})
    failing_rows(warehouse, [check.render(this=this) for check in checks])
    current = warehouse.current(spec.name, partition)
    warehouse.publish(spec_or_name=spec, partition=partition, run_id=run_id, expected_run_id=current, actor="bench")
    _redis().rpush(done_key, time.time())
