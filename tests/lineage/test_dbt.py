"""OpenLineage events of the example dbt project's cascade (docs/examples/dbt_shop,
orders -> daily_sales over three days) as the test's HTTP receiver gets them: one START
and one COMPLETE per run, valid against the spec's schemas, the inputs exactly the
versions each run pinned (its consumption records). PostgreSQL only, as dbt is."""
from __future__ import annotations

import pytest

from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.lineage_out.events import request_uuid, run_uuid
from backfill_portal.execution.models import Run
from tests.dbt.conftest import dbt_shop, postgres_only, shop_orders, sync_dbt  # noqa: F401  (fixtures)
from tests.dbt.test_dbt_postgres import cascade
from tests.lineage.test_events import assert_inputs_are_the_pins, by_run, output_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, postgres_only]


def test_the_dbt_example_cascade_tells_the_versions_each_model_read(personas, dbt_shop, shop_orders, task_queue,
                                                                     warehouse, receiver, openlineage_spec):
    sync_dbt(dbt_shop)
    request = cascade(personas)
    task_queue.drain()
    runs = list(Run.objects.filter(request=request).select_related("job__dataset"))
    assert len(runs) == 6 and {r.status for r in runs} == {RunStatus.PUBLISHED}
    for event in receiver.events:
        openlineage_spec.validate(event)
    events = by_run(receiver.events)
    assert set(events) == {run_uuid(r.run_id) for r in runs}
    for run in runs:
        start, complete = events[run_uuid(run.run_id)]
        assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
        assert complete["job"]["name"] == run.job.name
        assert complete["job"]["facets"]["jobType"]["jobType"] == "DBT"
        assert complete["run"]["facets"]["parent"]["run"]["runId"] == request_uuid(request.pk)
        assert_inputs_are_the_pins(run, complete)
        assert output_of(complete)["facets"]["version"]["datasetVersion"] == run.run_id
    # daily_sales read the orders versions this request published.
    orders = {r.partition_key: r.run_id for r in runs if r.job.name == "orders"}
    for run in runs:
        if run.job.name == "daily_sales":
            complete = events[run_uuid(run.run_id)][-1]
            read = {i["name"].split(".")[-1]: i for i in complete["inputs"]}["orders"]
            assert read["inputFacets"]["backfillPortal_read"]["partitions"] == {run.partition_key: orders[run.partition_key]}
