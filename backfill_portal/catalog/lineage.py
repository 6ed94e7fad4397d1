"""Lineage: the downstream closure of a job, layered, with the partitions each node
would rebuild for a UTC span (mapping across grains: a daily change touches the
hourly partitions inside it and the month that contains it).

The graph is loaded from the catalog with two queries and walked in memory; the
partition mapping is computed once per (grain, timezone) and shared.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from backfill_portal.catalog.calendar import partition_for, plan_intervals
from backfill_portal.catalog.kinds import has_side_effects
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


class LineageNode:
    """One job of a closure: `layer` 0 is the root; a node comes after every upstream
    inside the closure (`upstream_jobs`)."""

    __slots__ = ("job", "layer", "upstream_jobs", "partitions")

    def __init__(self, job: GraphJob, layer: int, upstream_jobs: list[str], partitions: list[str]):
        self.job, self.layer, self.upstream_jobs, self.partitions = job, layer, upstream_jobs, partitions

    @property
    def is_side_effect(self) -> bool:
        return has_side_effects(self.job.kind)


class LineageGraph:
    """Job-to-job edges with a global topological order, computed once per load, so a
    closure is a walk plus one pass in that order."""

    def __init__(self, jobs: dict[str, GraphJob]):
        self.jobs = jobs
        producer = {job.dataset: name for name, job in jobs.items()}
        self.upstream_jobs = {name: [producer[d] for d in job.reads if d in producer] for name, job in jobs.items()}
        self.downstream_jobs: dict[str, list[str]] = {name: [] for name in jobs}
        for name, ups in self.upstream_jobs.items():
            for up in ups:
                self.downstream_jobs[up].append(name)
        self.topo_index = self._topological_index()
        self.grain_of = {name: (job.grain, job.timezone) for name, job in jobs.items()}
        self._mapping: dict[tuple, list[str]] = {}

    def _topological_index(self) -> dict[str, int]:
        pending = {name: len(ups) for name, ups in self.upstream_jobs.items()}
        ready = deque(sorted(name for name, count in pending.items() if count == 0))
        index: dict[str, int] = {}
        while ready:
            name = ready.popleft()
            index[name] = len(index)
            for consumer in self.downstream_jobs[name]:
                pending[consumer] -= 1
                if pending[consumer] == 0:
                    ready.append(consumer)
        if len(index) != len(self.jobs):
            cyclic = sorted(set(self.jobs) - set(index))
            raise ValueError("lineage has a cycle through " + ", ".join(cyclic[:5]))
        return index

    _CACHE: dict = {}

    @classmethod
    def cached(cls) -> LineageGraph:
        """The graph, reloaded only when the catalog changed (one cheap query)."""
        from django.db.models import Max

        # Both maxima come from indexes; the catalog is changed by sync, which saves
        # every job and dataset it touches (jobs are never deleted: runs protect them).
        key = (Job.objects.aggregate(at=Max("updated_at"))["at"], Dataset.objects.aggregate(at=Max("updated_at"))["at"])
        if cls._CACHE.get("key") != key:
            cls._CACHE.update(key=key, graph=cls.load())
        return cls._CACHE["graph"]

    @classmethod
    def load(cls) -> LineageGraph:
        owners = dict(Dataset.objects.values_list("name", "owner__username"))
        reads: dict[int, list[str]] = {}
        for job_id, dataset in Job.upstreams.through.objects.values_list("job_id", "dataset__name"):
            reads.setdefault(job_id, []).append(dataset)
        jobs = {}
        rows = Job.objects.values_list("pk", "name", "dataset__name", "kind", "depends_on_past",
                                       "dataset__grain", "dataset__timezone")
        for pk, name, dataset, kind, dop, grain, tz in rows:
            jobs[name] = GraphJob(name, dataset, kind, dop, grain, tz, owners.get(dataset, ""),
                                  tuple(sorted(reads.get(pk, ()))))
        return cls(jobs)

    def closure(self, root: str, *, start: datetime | None = None, end: datetime | None = None) -> list[LineageNode]:
        """The root and everything downstream as nodes, layered by longest path from
        the root, with the partitions each would rebuild for [start, end) when given."""
        return self.walk(root, start=start, end=end).nodes()

    def expand(self, root: str, start: datetime, end: datetime) -> list[LineageNode]:
        return self.closure(root, start=start, end=end)

    def walk(self, root: str, *, start: datetime | None = None, end: datetime | None = None) -> Closure:
        """The computation behind closure(), kept compact: names in topological order,
        their layers, and one partition list per (grain, timezone)."""
        if root not in self.jobs:
            raise KeyError(root)
        seen = {root}
        queue = deque([root])
        downstream = self.downstream_jobs
        while queue:
            for consumer in downstream[queue.popleft()]:
                if consumer not in seen:
                    seen.add(consumer)
                    queue.append(consumer)
        order = sorted(seen, key=self.topo_index.__getitem__)
        # Topological order: an upstream inside the closure already has its layer; one
        # outside it has none (get -> None) and does not count.
        upstream_jobs, layer = self.upstream_jobs, {root: 0}
        get = layer.get
        for name in order[1:]:
            depth = 0
            for u in upstream_jobs[name]:
                d = get(u)
                if d is not None and d >= depth:
                    depth = d + 1
            layer[name] = depth
        partitions: dict[tuple[str, str], list[str]] = {}
        if start is not None:
            for grain, tz in set(map(self.grain_of.__getitem__, order)):
                key = (grain, tz, start, end)
                if key not in self._mapping:
                    if len(self._mapping) > 256:
                        self._mapping.clear()
                    self._mapping[key] = covered_partition_keys(grain=grain, timezone=tz, start=start, end=end)
                partitions[(grain, tz)] = self._mapping[key]
        return Closure(graph=self, root=root, order=order, layer=layer, partitions=partitions)


@dataclass
class Closure:
    graph: LineageGraph
    root: str
    order: list[str]                  # topological
    layer: dict[str, int]
    partitions: dict[tuple[str, str], list[str]]

    def nodes(self) -> list[LineageNode]:
        jobs, layer, ups = self.graph.jobs, self.layer, self.graph.upstream_jobs
        nodes = [LineageNode(jobs[n], layer[n], [u for u in ups[n] if u in layer] if n != self.root else [],
                             self.partitions.get((jobs[n].grain, jobs[n].timezone), []))
                 for n in self.order]
        nodes.sort(key=_layer_of)  # stable: topological order within a layer
        return nodes


def _layer_of(node: LineageNode) -> int:
    return node.layer


def covered_partitions(*, grain: str, timezone: str, start: datetime, end: datetime):
    """Partitions (PlannedInterval) of a grain/timezone overlapping the UTC span [start, end)."""
    first = partition_for(grain=grain, timezone=timezone, at=start)
    last = partition_for(grain=grain, timezone=timezone, at=end - timedelta(microseconds=1))
    return plan_intervals(grain=grain, timezone=timezone, first=first.partition_key, last=last.partition_key)


def covered_partition_keys(*, grain: str, timezone: str, start: datetime, end: datetime) -> list[str]:
    return [p.partition_key for p in covered_partitions(grain=grain, timezone=timezone, start=start, end=end)]
