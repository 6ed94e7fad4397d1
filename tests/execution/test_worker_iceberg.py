"""kill -9 of a real Celery worker while it writes a 1,000,000-row partition on the
Iceberg warehouse (issue #18; docs/iceberg.md): no reader of the table sees any of it,
the orphan sweep deletes what the dead writer left, the retry commits once, and after
it every data file of the table is one the published version lists. The metadata is
this test's PostgreSQL, the warehouse pyiceberg's SQL catalog in a SQLite file shared
with the worker. Skipped (with the reason) unless CI's second pass provides PostgreSQL
and Redis."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.catalog.specs import spec_for
from backfill_portal.execution.choices import AttemptStatus
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Publication
from tests.conftest import TEST_CATALOG
from tests.execution.jobs import MILLION_ROWS
from tests.execution.test_pipeline import approved_request
from tests.execution.test_worker import running_attempt, sweep_until_published, wait_for
from tests.workers import BROKER

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(not BROKER.startswith("redis"), reason="needs CELERY_BROKER_URL=redis://... (CI's second pass)"),
]


@pytest.fixture
def warehouse_url(settings, tmp_path):
    """An Iceberg warehouse for this test and the worker it starts."""
    from backfill_portal.backends import reset_warehouse_cache

    url = f"iceberg+sqlite:///{tmp_path / 'catalog.db'}?warehouse={tmp_path / 'iceberg'}"
    settings.WAREHOUSE_URL = url
    reset_warehouse_cache()
    yield url
    reset_warehouse_cache()


@pytest.fixture
def million_items(personas):
    plan = yaml.safe_load(TEST_CATALOG)
    dataset = next(d for d in plan["datasets"] if d["name"] == "slow_items")
    plan["datasets"].append({**dataset, "name": "million_items"})
    plan["jobs"].append({"name": "million_items", "produces": "million_items", "reads": [], "kind": "python",
                         "pool": "warehouse", "max_attempts": 3, "heartbeat_timeout_seconds": 10,
                         "callable": "tests.execution.jobs.million_items"})
    return catalog_sync(text=yaml.safe_dump(plan))


def dead(pid: int) -> bool:
    """the killed process is gone (or a zombie: its files, and so its lock, are closed)"""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def planned_files(warehouse, name: str, partition: str | None = None) -> set[str]:
    """The data files an Iceberg reader of the table plans over now (pyiceberg)."""
    from pyiceberg.expressions import AlwaysTrue, EqualTo

    table = warehouse.catalog.load_table(f"{warehouse.namespace}.{name}")
    if table.current_snapshot() is None:
        return set()
    scan = table.scan(row_filter=AlwaysTrue() if partition is None else EqualTo("_partition", partition))
    return {task.file.file_path.removeprefix("file://") for task in scan.plan_files()}


def test_kill_9_while_writing_a_million_row_partition_no_reader_sees_it_and_the_retry_commits_once(
        personas, million_items, start_worker, warehouse):
    start_worker(name="test-iceberg-worker", SWEEP_SECONDS=1)
    request = approved_request(personas, job="million_items", start="2022-10-01", end="2022-10-01")
    run = wait_for(lambda: Run.objects.filter(request=request).first())
    attempt = wait_for(lambda: running_attempt(run))
    spec = spec_for(run.job.dataset)
    wait_for(lambda: len(warehouse.run_files(spec, run.run_id)) >= 20, timeout=120)  # well into the writing
    metadata = warehouse.catalog.load_table(f"{warehouse.namespace}.million_items").metadata_location
    pid = int(attempt.worker.rsplit(":", 1)[-1])
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: dead(pid))

    written = warehouse.run_files(spec, run.run_id)
    assert len(written) >= 20 and warehouse.marker(run.run_id) is None
    # No reader sees any of it: the table's metadata did not move while it was written.
    table = warehouse.catalog.load_table(f"{warehouse.namespace}.million_items")
    assert table.metadata_location == metadata
    assert planned_files(warehouse, "million_items") == set()
    assert warehouse.read_partition("million_items", run.partition_key) == []
    # The sweep deletes what the dead writer left, once its lock has gone with it: the
    # kernel drops the flock when the last of the process's threads has exited, a moment
    # after its main thread shows as a zombie (measured: one more try, 0.3 s later).
    def sweep():
        """the sweep deleted the dead writer's files"""
        return warehouse.sweep_orphans(spec)

    swept = wait_for(sweep, timeout=30)
    assert set(written) <= set(swept)
    assert warehouse.run_files(spec, run.run_id) == []

    run = sweep_until_published(run, timeout=300)

    attempts = list(run.attempts.order_by("attempt_no"))
    assert [a.status for a in attempts] == [AttemptStatus.LOST, AttemptStatus.SUCCEEDED]
    assert Publication.objects.filter(version__run=run).count() == 1
    history = warehouse.history("million_items", run.partition_key)
    assert [(r.run_id, r.action) for r in history] == [(run.run_id, "publish")]  # one Iceberg commit
    marker = warehouse.marker(run.run_id)
    assert (marker.row_count, marker.attempt_no) == (MILLION_ROWS, attempts[-1].attempt_no)
    profile = warehouse.profile(spec=spec, run_id=run.run_id)
    assert (profile.distinct_keys, profile.duplicate_keys) == (MILLION_ROWS, 0)
    # A reader plans over exactly the retry's files, and no other data file is left.
    published = set(warehouse.run_files(spec, run.run_id))
    assert published and planned_files(warehouse, "million_items", run.partition_key) == published
    assert {str(p) for p in Path(warehouse.table_location("million_items")).rglob("*.parquet")} == published
    assert warehouse.sweep_orphans(spec) == []
    table = warehouse.catalog.load_table(f"{warehouse.namespace}.million_items")
    assert table.scan(selected_fields=("n",)).to_arrow().num_rows == MILLION_ROWS
