"""Forward staleness of a `depends_on_past` dataset.

Each partition of such a dataset reads the previous one (`ref_previous()`), so
republishing partition P changes the input of P+1, whose new version changes the input
of P+2, and so on: every partition published after P was built from a chain that no
longer holds. A request that republishes P therefore also rebuilds them, strictly in
order after P, unless the requester excludes some of them explicitly (recorded on the
request and in its audit rows).

Read-only: the published partitions come from the publication mirror (a rollback moves
a pointer back, never removes it, so every partition with a publication is published).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from backfill_portal.catalog.calendar import PlannedInterval, partition_for, previous_partition
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ValidationError
from backfill_portal.warehouse.models import Publication

FIELD = "exclude_stale"


@dataclass
class StaleLater:
    """The published partitions of `job`'s dataset after `after` (the last partition
    the request republishes): `included` are rebuilt, `excluded` the requester left out."""

    job: Job
    after: str
    included: list[PlannedInterval] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    dropped_intervals: list[PlannedInterval] = field(default_factory=list, repr=False)

    @property
    def note(self) -> str:
        return f"stale: a later partition of a depends_on_past dataset; it read {self.after}, republished here"

    def marked(self) -> list[tuple[str, bool]]:
        """Every stale partition in time order, with whether it is excluded."""
        dropped = set(self.excluded)
        later = sorted([*self.included, *self.dropped_intervals], key=lambda p: p.start)
        return [(p.partition_key, p.partition_key in dropped) for p in later]

    def as_dict(self) -> dict:
        return {"after": self.after, "included": [p.partition_key for p in self.included],
                "excluded": list(self.excluded)}


def published_after(*, job: Job, after: PlannedInterval) -> list[PlannedInterval]:
    """The dataset's published partitions that start at or after `after` ends, oldest
    first. Ordered by their UTC start, not by key: an hourly key's offset does not sort."""
    dataset = job.dataset
    rows = (Publication.objects.filter(dataset_id=dataset.pk, version__run__data_interval_start__gte=after.end)
            .values_list("partition_key", "version__run__data_interval_start", "version__run__data_interval_end")
            .distinct())
    seen: dict[str, PlannedInterval] = {}
    for key, start, end in rows:
        seen.setdefault(key, PlannedInterval(key, start, end, dataset.grain, dataset.timezone))
    return sorted(seen.values(), key=lambda p: p.start)


def stale_later(*, job: Job, after: PlannedInterval, exclude: Iterable[str] = ()) -> StaleLater:
    """What republishing `after` makes stale for a depends_on_past job, minus `exclude`.
    Excluding a partition that is not stale is refused (field `exclude_stale`)."""
    later = published_after(job=job, after=after)
    keys = {p.partition_key for p in later}
    exclude = list(dict.fromkeys(str(k) for k in exclude))
    unknown = [k for k in exclude if k not in keys]
    if unknown:
        stale = ", ".join(p.partition_key for p in later[:10]) or "none"
        raise ValidationError(
            f"{job.name} {', '.join(repr(k) for k in unknown)}: not a stale partition of this plan "
            f"(stale after {after.partition_key}: {stale})", field=FIELD)
    dropped = set(exclude)
    return StaleLater(job=job, after=after.partition_key,
                      included=[p for p in later if p.partition_key not in dropped],
                      excluded=[p.partition_key for p in later if p.partition_key in dropped],
                      dropped_intervals=[p for p in later if p.partition_key in dropped])


def gap_before(*, job: Job, first: PlannedInterval) -> str | None:
    """Why `first` cannot be built yet, or None. A depends_on_past partition reads the
    one before it; where the dataset begins there is none, and it starts from nothing.
    With an earlier partition published but not the previous one (a gap), it would start
    from nothing in the middle of the history: a running total one day's worth, matched
    by every check. The message names the first missing partition to start from."""
    if not job.depends_on_past:
        return None
    dataset = job.dataset
    latest = (Publication.objects.filter(dataset_id=dataset.pk, version__run__data_interval_end__lte=first.start)
              .order_by("-version__run__data_interval_end")
              .values_list("partition_key", "version__run__data_interval_end").first())
    if latest is None or latest[1] >= first.start:
        return None  # where the dataset begins, or its previous partition is published
    missing = partition_for(grain=dataset.grain, timezone=dataset.timezone, at=latest[1]).partition_key
    previous = previous_partition(grain=dataset.grain, timezone=dataset.timezone, partition_key=first.partition_key)
    return (f"{dataset.name} {first.partition_key} depends on its previous partition {previous}, which was never "
            f"published (the latest before it is {latest[0]}): start {job.name} from {missing}, or it would "
            "start from nothing")


def check_exclusions(exclude: dict[str, list[str]] | None, planned: dict[str, StaleLater]) -> list[str]:
    """Field messages for exclusions naming a job that has no stale partitions in the plan."""
    errors = []
    for name in exclude or {}:
        if name not in planned:
            errors.append(f"{name!r} has no stale later partitions in this plan: only a depends_on_past job "
                          "whose partitions after the republished ones are published has any")
    return errors
