"""Catalog pages: datasets and jobs, and one job's code versions with diffs."""
from __future__ import annotations

import difflib
import json

from django.contrib.auth.decorators import login_required

from backfill_portal.catalog.models import CodeVersion, Job
from backfill_portal.catalog.selectors import dataset_list, job_list
from backfill_portal.core.errors import NotFound
from backfill_portal.core.web import application_errors, render_page

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
