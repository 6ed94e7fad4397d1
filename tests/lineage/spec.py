"""Validation of events against the OpenLineage spec's own JSON schemas, offline.

No PyPI package ships the spec's schemas (openlineage-python has only the classes
generated from them), CI reaches no website, and this repository commits no fetched
files. So the schemas are read from a directory: `OPENLINEAGE_SPEC_DIR`, else
`shared/openlineage-spec` beside the checkout (where CI has the steering repository's
shared/): the `spec/` folder of OpenLineage at tag 1.52.0, the release of the pinned
client, whose facets' `_schemaURL`s are exactly those files' `$id`s. Without it the
tests that need it are skipped, saying so.

Every event is validated as a RunEvent of OpenLineage.json (2-0-2), and every facet in
it against the schema its `_schemaURL` names: the spec's facet files, or the portal's
own (docs/openlineage/*.json). A facet whose schema is unknown fails.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from dateutil import parser as dateparser
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[2]
RUN_EVENT = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"


def spec_dir() -> Path | None:
    candidates = [os.environ.get("OPENLINEAGE_SPEC_DIR", ""), ROOT.parent / "shared" / "openlineage-spec"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "OpenLineage.json").is_file():
            return Path(candidate)
    return None


class SpecValidator:
    def __init__(self, directory: Path):
        files = [directory / "OpenLineage.json", *sorted((directory / "facets").glob("*.json")),
                 *sorted((ROOT / "docs" / "openlineage").glob("*.json"))]
        documents = [json.loads(f.read_text()) for f in files]
        self.registry = Registry().with_resources(
            (doc["$id"], Resource.from_contents(doc)) for doc in documents)
        self.ids = {doc["$id"] for doc in documents}

    def _check(self, instance: dict, ref: str) -> None:
        Draft202012Validator({"$ref": ref}, registry=self.registry).validate(instance)

    def validate(self, event: dict) -> None:
        """Raises on the first violation: the event, then each facet by its _schemaURL."""
        self._check(event, RUN_EVENT)
        uuid.UUID(event["run"]["runId"])  # formats the schema names but does not assert
        dateparser.isoparse(event["eventTime"])
        for facet in facets_of(event):
            url = facet["_schemaURL"]
            assert url.split("#")[0] in self.ids, f"no schema for facet {url}"
            self._check(facet, url)


def facets_of(event: dict) -> list[dict]:
    found = [*event["run"].get("facets", {}).values(), *event["job"].get("facets", {}).values()]
    for dataset in [*event.get("inputs", []), *event.get("outputs", [])]:
        for key in ("facets", "inputFacets", "outputFacets"):
            found.extend(dataset.get(key, {}).values())
    return found
