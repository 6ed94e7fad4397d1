"""Dataset and partition pages: what readers see now (the warehouse's current pointer),
the history of pointer moves, and the rollback of one partition with its impact.

The rollback itself is recovery.rollback.partition_rollback (the same call
as the API's); these views only show what it would do and offer it to those it allows.
"""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Max
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from backfill_portal.backfills.policy import may_roll_back_partition
from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.specs import reader_layout_of
from backfill_portal.core.errors import ApplicationError, ConflictError, NotFound, PermissionDenied
from backfill_portal.core.web import (
    application_errors,
    error_messages,
    error_status,
    is_htmx,
    keyset_page_by,
    redirect_after_post,
    render_page,
)
from backfill_portal.web.forms import cleaned
from backfill_portal.web.forms.partitions import RollbackForm
from backfill_portal.warehouse.models import Contamination, Publication
from backfill_portal.backends import get_warehouse
from backfill_portal.warehouse.selectors import built_on_a_replaced_past, partition_state
from backfill_portal.recovery.rollback import (
    built_from_rolled_back,
    consumers_of,
    impact_preview,
    partition_contamination,
    partition_rollback,
    partition_rollback_rebuild,
    require_partition_rollback,
    previous_verified,
    rollback_state,
)

PARTITIONS_PER_PAGE = 100
HISTORY_SHOWN = 200


def _dataset_or_404(name: str) -> Dataset:
    ds = Dataset.objects.select_related("owner", "team", "job").filter(name=name).first()
    if ds is None:
        raise NotFound(f"dataset {name!r} does not exist")
    return ds


@login_required
@application_errors
def dataset_detail(request, name: str):
    """Partitions with their current version, latest partition keys first, 100 a page.

    1. One GROUP BY: the newest publication id per partition key (keyset on the key).
    2. Those publications with their versions and runs.
    3. The warehouse's pointers for the same keys (the truth), to flag a mirror that lags.
    4. The closure entries among those versions, to flag what needs a rebuild."""
    ds = _dataset_or_404(name)
    page = keyset_page_by(
        Publication.objects.filter(dataset=ds).values("partition_key").annotate(last=Max("id")),
        "partition_key", request.GET.get("before"), size=PARTITIONS_PER_PAGE)
    by_id = {p.pk: p for p in Publication.objects.filter(pk__in=[r["last"] for r in page.rows])
             .select_related("version__run", "actor")}
    keys = [r["partition_key"] for r in page.rows]
    pointers = get_warehouse().current_many(ds.name, keys) if keys and not ds.is_source else {}
    # 4. Which of those versions a rollback's closure names (built from a rolled-back input).
    contaminated = set(Contamination.objects.filter(version_id__in=[p.version_id for p in by_id.values()])
                       .values_list("version_id", flat=True))
    # 5. For a depends_on_past dataset: which read a previous partition since replaced.
    stale = built_on_a_replaced_past(ds, pointers)
    rows = []
    for r in page.rows:
        pub = by_id[r["last"]]
        warehouse_run = pointers.get(r["partition_key"])
        rows.append({"key": r["partition_key"], "pub": pub, "version": pub.version,
                     "in_sync": warehouse_run == pub.version.run.run_id, "warehouse_run": warehouse_run,
                     "contaminated": pub.version_id in contaminated, "stale": stale.get(r["partition_key"])})
    return render_page(request, "warehouse/dataset.html", {"ds": ds, "page": page, "rows": rows,
                                                           "per_page": PARTITIONS_PER_PAGE,
                                                           "reader_layout": reader_layout_of(ds)})


def _partition_context(user, name: str, key: str) -> dict:
    """Everything the partition page and the rollback confirmation show, in a fixed
    number of queries: the dataset, its publications, its versions (partition_state),
    and the consumers of the current version."""
    state = partition_state(dataset_name=name, partition_key=key)
    ds, pubs, versions, key = state["dataset"], state["publications"], state["versions"], state["partition_key"]
    current_run_id = state["current_run_id"]
    current = next((v for v in versions if v.run.run_id == current_run_id), None) if current_run_id else None
    in_effect = next((p for p in pubs if p.version.run.run_id == current_run_id), None) if current_run_id else None
    target, blocked = None, ""
    if current is None:
        blocked = "Nothing is published for this partition, so there is nothing to roll back."
    elif in_effect is None:
        blocked = "The current version is not in the publication history yet; reconcile the metadata first."
    elif in_effect.action == Publication.Action.ROLLBACK:
        blocked = ("This partition was already rolled back to the current version; publish a new version "
                   "instead of rolling back again.")
    else:
        target = previous_verified(pubs, current_run_id)
        if target is None:
            blocked = "There is no previous verified version to go back to."
    return {
        "ds": ds, "key": key, "current_run_id": current_run_id, "current": current, "in_effect": in_effect,
        "publications": pubs[:HISTORY_SHOWN], "more_history": max(0, len(pubs) - HISTORY_SHOWN),
        "versions": versions[:HISTORY_SHOWN], "target": target, "blocked": blocked,
        # Whom the page offers the button: backfills.policy, which the service asks too.
        "can_rollback": may_roll_back_partition(user, ds).allowed,
        "contamination": None if ds.is_source else partition_contamination(dataset=ds, partition_key=key),
        "stale_past": built_on_a_replaced_past(ds, {key: current_run_id}).get(key) if current_run_id else None,
        "recent_rollback": in_effect if in_effect is not None and in_effect.action == Publication.Action.ROLLBACK
        else None,
    }


@login_required
@application_errors
def partition_detail(request, name: str, key: str):
    ctx = _partition_context(request.user, name, key)
    if ctx["key"] != key:  # another spelling of the partition (an hour in UTC, ...): its own address
        return redirect("partition", name, ctx["key"])
    rolled = ctx["recent_rollback"]
    # After a rollback: who read the version that was rolled back (one query).
    ctx["rolled_back_consumers"] = consumers_of([rolled.previous_version]) if rolled and rolled.previous_version_id \
        else []
    # ...and the whole closure built from it, with where each entry stands.
    ctx["rolled_back_impact"] = rollback_state(dataset=name, partition_key=key)["impact"] if rolled else []
    return render_page(request, "warehouse/partition.html", ctx)


def _with_consumers(ctx: dict) -> dict:
    """The rollback's impact: the consumer runs that read the current version, the
    datasets they produced, and the contaminated closure (every published version built
    from it, directly or through others, with depth and via)."""
    ctx["consumers"] = consumers_of([ctx["current"]]) if ctx["current"] is not None else []
    ctx["impact"] = impact_preview([ctx["current"]]) if ctx["current"] is not None else []
    ctx["consumer_datasets"] = sorted({c["dataset"] for c in ctx["consumers"]})
    ctx["target_tainted"] = built_from_rolled_back(ctx["target"])
    return ctx


def _confirm_response(request, ctx: dict, *, status: int = 200) -> HttpResponse:
    """The confirmation: a fragment for htmx, a page of its own otherwise."""
    if is_htmx(request):
        return render(request, "warehouse/partials/_rollback_confirm.html", ctx, status=status)
    return render_page(request, "warehouse/rollback_confirm.html", ctx, status=status)


@login_required
@application_errors
@require_http_methods(["GET", "POST"])
def partition_rollback_confirm(request, name: str, key: str):
    """GET: the impact (from -> to, consumer runs that read the current version and the
    datasets they produced) and the form. POST: partition_rollback, then optionally
    file the rebuilds; a refusal is shown in the confirmation with its status."""
    ctx = _with_consumers(_partition_context(request.user, name, key))
    if not ctx["can_rollback"] and request.method == "GET":
        raise PermissionDenied("rolling back needs on-call, an admin or the dataset owner")
    if request.method == "GET":
        ctx["form"] = RollbackForm(initial={"rebuild": bool(ctx["impact"])})
        return _confirm_response(request, ctx)

    form = RollbackForm(request.POST)
    ctx["form"] = form
    try:
        data = cleaned(form, permission=lambda: require_partition_rollback(actor=request.user, dataset=name,
                                                                           partition_key=key))
        result = partition_rollback(actor=request.user, dataset=name, partition_key=key,
                                    reason=data.get("reason", ""))
    except ApplicationError as exc:
        if set(exc.fields) & set(form.fields):
            for field, texts in exc.fields.items():
                for text in texts:
                    if field in form.fields and text not in form.errors.get(field, ()):
                        form.add_error(field, text)
        else:
            # Show the partition as it is now (someone may have moved the pointer meanwhile).
            ctx.update(_with_consumers(_partition_context(request.user, name, key)))
            ctx["refusal"] = {"status": error_status(exc), "messages": error_messages(exc),
                              "conflict": isinstance(exc, ConflictError)}
        return _confirm_response(request, ctx, status=error_status(exc))
    text = (f"Rolled back {name}/{key}: readers now see {result['to_run_id']} again "
            f"(was {result['from_run_id']}).")
    consumers, impact = result["consumers"], result["impact"]
    if consumers:
        text += f" {len(consumers)} consumer run(s) had read the rolled-back version."
    if impact:
        text += f" {len(impact)} published partition(s) were built from it and are marked until rebuilt."
    messages.success(request, text)
    if data.get("rebuild") and impact:
        _file_rebuilds(request, name, key)
    return redirect_after_post(request, reverse("partition", args=[name, key]))


def _file_rebuilds(request, name: str, key: str) -> None:
    """File the rebuild and say so; a refusal of the state (nothing to rebuild: a 409) is
    a message on the partition page. Someone who may not file it, or a partition that
    does not exist, is the error page with its status (403, 404), as for any action."""
    try:
        filed = partition_rollback_rebuild(actor=request.user, dataset=name, partition_key=key)
    except (PermissionDenied, NotFound):
        raise
    except ApplicationError as exc:
        messages.error(request, f"The rebuild was not filed: {exc.message}")
        return
    if filed:
        messages.info(request, ("Filed for approval to rebuild the consumers and everything built from them: "
                                if filed.new else "Already filed to rebuild them: ")
                      + ", ".join(f"#{r.pk} ({r.job.name} {r.first_partition}→{r.last_partition}"
                                  f"{f' and {len(r.node_actions)} job(s) downstream' if r.node_actions else ''})"
                                  for r in filed) + ".")


@login_required
@application_errors
@require_POST
def partition_rebuild_consumers(request, name: str, key: str):
    """The one-click cascade after a rollback, offered on the partition page."""
    partition_state(dataset_name=name, partition_key=key)  # 404 for a dataset or partition that does not exist
    _file_rebuilds(request, name, key)
    return redirect_after_post(request, reverse("partition", args=[name, key]))
