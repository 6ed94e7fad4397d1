"""Catalog pages: datasets and jobs, one job's code versions with diffs, and the lineage
page (its drawing: web.picture)."""
from __future__ import annotations

import difflib
import json

from django.contrib.auth.decorators import login_required

from backfill_portal.catalog.lineage import LineageGraph
from backfill_portal.catalog.models import CodeVersion, Job
from backfill_portal.web.picture import lineage_inputs, lineage_picture
from backfill_portal.catalog.selectors import dataset_list, job_list
from backfill_portal.core.errors import NotFound, ValidationError
from backfill_portal.core.web import application_errors, parse_int, render_page

VERSIONS_SHOWN = 50


@login_required
def catalog(request):
    return render_page(request, "catalog/catalog.html", {
        "datasets": list(dataset_list().select_related("job__current_code_version")),
        "jobs": list(job_list()),
    })


def definition_text(definition: dict) -> list[str]:
    """A diffable rendering: the SQL template as written, then the rest as sorted JSON."""
    rest = {k: v for k, v in definition.items() if k != "sql"}
    lines = json.dumps(rest, indent=2, sort_keys=True, default=str).splitlines()
    if "sql" in definition:
        lines = ["-- sql", *str(definition["sql"]).rstrip("\n").splitlines(), "-- definition", *lines]
    return lines


def _diff(older: CodeVersion, newer: CodeVersion) -> list[tuple[str, str]]:
    """Unified diff lines tagged for colouring: add, del, hunk, meta or ctx."""
    out = []
    for line in difflib.unified_diff(definition_text(older.definition), definition_text(newer.definition),
                                     fromfile=older.short_hash, tofile=newer.short_hash, lineterm=""):
        if line.startswith(("+++", "---")):
            kind = "meta"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append((kind, line))
    return out


@login_required
@application_errors
def job_detail(request, name: str):
    job = (Job.objects.select_related("dataset__owner", "dataset__team", "pool", "current_code_version")
           .prefetch_related("upstreams").filter(name=name).first())
    if job is None:
        raise NotFound(f"job {name} does not exist")
    versions = list(CodeVersion.objects.filter(job=job).order_by("-created_at", "-id")[: VERSIONS_SHOWN + 1])
    more = len(versions) > VERSIONS_SHOWN
    versions = versions[:VERSIONS_SHOWN]
    rows = []
    for i, version in enumerate(versions):
        older = versions[i + 1] if i + 1 < len(versions) else None
        rows.append({"version": version, "older": older, "diff": _diff(older, version) if older else None,
                     "text": definition_text(version.definition) if older is None else None})
    return render_page(request, "catalog/job_detail.html", {"job": job, "rows": rows, "more": more,
                                                              "versions_shown": VERSIONS_SHOWN})


@login_required
@application_errors
def lineage(request):
    """?root=<job> draws the closure of a job; ?request=<id> highlights the nodes a
    request touches (its root by default); neither draws the whole catalog."""
    from backfill_portal.backfills.selectors import request_get

    root = (request.GET.get("root") or "").strip()
    req = None
    req_id = parse_int(request.GET.get("request"))
    if request.GET.get("request") and req_id is None:
        raise NotFound(f"backfill request {request.GET.get('request')!r} does not exist")
    if req_id is not None:
        req = request_get(req_id)
        root = root or req.job.name
    try:
        graph = LineageGraph.cached()
    except ValueError as exc:  # a cycle: the catalog loader refuses them, but say so rather than crash
        raise ValidationError(str(exc)) from None
    if root and root not in graph.jobs:
        raise NotFound(f"job {root!r} does not exist")
    picture = lineage_picture(graph, root=root or None, req=req, inputs=lineage_inputs(graph, root or None))
    return render_page(request, "catalog/lineage.html", {
        "picture": picture, "root": root, "req": req, "job_names": sorted(graph.jobs),
    })
