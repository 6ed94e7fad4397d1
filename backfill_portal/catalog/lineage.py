"""Lineage: the downstream closure of a job, layered, with the partitions each node
would rebuild for a UTC span (mapping across grains: a daily change touches the
hourly partitions inside it and the month that contains it).

The graph is loaded from the catalog with two queries and walked in memory; the
partition mapping is computed once per (grain, timezone) and shared.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from backfill_portal.backfills.planning import partition_for, plan_intervals
from backfill_portal.catalog.models import Dataset, Job


@dataclass(frozen=True)
class GraphJob:
    name: str
    dataset: str
    kind: str
    depends_on_past: bool
    grain: str
    timezone: str
    owner: str
    reads: tuple[str, ...]


@dataclass
class LineageNode:
    job: GraphJob
    layer: int                        # 0 = the root; a node comes after all its upstreams
    upstream_jobs: list[str]          # upstream jobs inside the closure
    partitions: list[str] = field(default_factory=list)

    @property
    def is_side_effect(self) -> bool:
        return self.job.kind == "side_effect"


@dataclass
class LineageGraph:
    jobs: dict[str, GraphJob]
    consumers: dict[str, list[str]]   # dataset -> jobs reading it
    producer: dict[str, str]          # dataset -> job producing it

    @classmethod
    def load(cls) -> LineageGraph:
        owners = dict(Dataset.objects.values_list("name", "owner__username"))
        reads: dict[int, list[str]] = {}
        for job_id, dataset in Job.upstreams.through.objects.values_list("job_id", "dataset__name"):
            reads.setdefault(job_id, []).append(dataset)
        jobs, consumers, producer = {}, {}, {}
        rows = Job.objects.values_list("pk", "name", "dataset__name", "kind", "depends_on_past",
                                       "dataset__grain", "dataset__timezone")
        for pk, name, dataset, kind, dop, grain, tz in rows:
            job = GraphJob(name, dataset, kind, dop, grain, tz, owners.get(dataset, ""), tuple(sorted(reads.get(pk, ()))))
            jobs[name] = job
            producer[dataset] = name
            for up in job.reads:
                consumers.setdefault(up, []).append(name)
        return cls(jobs=jobs, consumers=consumers, producer=producer)

    def closure(self, root: str) -> list[LineageNode]:
        """The root and everything downstream, layered by longest path from the root
        (so a node's layer is after every upstream inside the closure)."""
        seen = {root}
        queue = deque([root])
        while queue:
            name = queue.popleft()
            for consumer in self.consumers.get(self.jobs[name].dataset, ()):
                if consumer not in seen:
                    seen.add(consumer)
                    queue.append(consumer)
        # Kahn's algorithm over the closure: layer = 1 + max(layer of upstreams).
        ups = {n: [self.producer[d] for d in self.jobs[n].reads if self.producer.get(d) in seen] for n in seen}
        ups[root] = []
        pending = {n: len(u) for n, u in ups.items()}
        layer = {root: 0}
        ready = deque(n for n, count in pending.items() if count == 0)
        order = []
        while ready:
            name = ready.popleft()
            order.append(name)
            for consumer in self.consumers.get(self.jobs[name].dataset, ()):
                if consumer in pending and consumer != root:
                    layer[consumer] = max(layer.get(consumer, 0), layer[name] + 1)
                    pending[consumer] -= 1
                    if pending[consumer] == 0:
                        ready.append(consumer)
        if len(order) != len(seen):
            raise ValueError("lineage has a cycle below " + root)
        return [LineageNode(job=self.jobs[n], layer=layer[n], upstream_jobs=ups[n]) for n in
                sorted(order, key=lambda n: (layer[n], n))]

    def expand(self, root: str, start: datetime, end: datetime) -> list[LineageNode]:
        """closure() with the partitions each node would rebuild for [start, end)."""
        nodes = self.closure(root)
        mapping: dict[tuple[str, str], list[str]] = {}
        for node in nodes:
            key = (node.job.grain, node.job.timezone)
            if key not in mapping:
                mapping[key] = covered_partition_keys(grain=key[0], timezone=key[1], start=start, end=end)
            node.partitions = mapping[key]
        return nodes


def covered_partitions(*, grain: str, timezone: str, start: datetime, end: datetime):
    """Partitions (PlannedInterval) of a grain/timezone overlapping the UTC span [start, end)."""
    first = partition_for(grain=grain, timezone=timezone, at=start)
    last = partition_for(grain=grain, timezone=timezone, at=end - timedelta(microseconds=1))
    return plan_intervals(grain=grain, timezone=timezone, first=first.partition_key, last=last.partition_key)


def covered_partition_keys(*, grain: str, timezone: str, start: datetime, end: datetime) -> list[str]:
    return [p.partition_key for p in covered_partitions(grain=grain, timezone=timezone, start=start, end=end)]
