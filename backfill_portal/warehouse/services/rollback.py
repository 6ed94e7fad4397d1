"""Rollback: move a partition's pointer back to its previous verified version.

The previous verified version is the one the current version replaced, walking the
publication history back past versions that were themselves rolled back. The move is
the warehouse's compare-and-set (`Warehouse.rollback`): if someone published since we
read the pointer, it is a conflict shown to the user, never an overwrite. The metadata
then mirrors it: a Publication(action=rollback), the current run -> rolled_back, the
restored run superseded -> published, and audit rows, in one transaction.

Every consumer run that read a rolled-back version is listed (from Consumption), and
`rollback_rebuild` files one request per affected consumer job to rebuild them on the
restored version. A rolled-back version is kept for diagnosis (see retention.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.backfills.transitions import request_transition
from backfill_portal.catalog.models import Dataset
from backfill_portal.core.errors import ConflictError, NotFound, ValidationError
from backfill_portal.core.roles import Role, deny, has_role
from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.transitions import run_transition
from backfill_portal.warehouse.models import Consumption, Publication, Version
from backfill_portal.warehouse.registry import get_warehouse

logger = logging.getLogger(__name__)

ROLLBACKABLE_REQUEST_STATES = (RequestStatus.RECONCILING, RequestStatus.COMPLETED, RequestStatus.FAILED)


@dataclass
class Move:
    """One planned pointer move: (dataset, partition) from `current` back to `target`."""

    dataset: Dataset
    partition_key: str
    current: Version
    target: Version
    request: BackfillRequest | None

    def as_dict(self) -> dict:
        return {"dataset": self.dataset.name, "partition_key": self.partition_key,
                "from_run_id": self.current.run.run_id, "to_run_id": self.target.run.run_id}


# -- reading the history ---------------------------------------------------------------------


def _history(dataset: Dataset, partition_key: str) -> list[Publication]:
    """Pointer moves of one partition, newest first, with their versions and runs."""
    return list(Publication.objects.filter(dataset=dataset, partition_key=partition_key)
                .select_related("version__run", "previous_version__run", "actor").order_by("-id"))


def previous_verified(history: list[Publication], current_run_id: str) -> Version | None:
    """The version a rollback of `current_run_id` would restore: the one its publication
    replaced, or further back when that one was itself rolled back (or purged). Only a
    superseded version qualifies: it was verified, published, then replaced.

    Rollback publications are not followed: after a rollback to V, the version "before"
    V is still the one V's own publication replaced."""
    run_id, since, seen = current_run_id, None, set()
    while True:
        pub = next((p for p in history if p.action == Publication.Action.PUBLISH and p.version.run.run_id == run_id
                    and (since is None or p.id < since)), None)
        if pub is None or pub.previous_version is None or pub.id in seen:
            return None
        seen.add(pub.id)
        candidate = pub.previous_version
        if (candidate.run.run_id != current_run_id and candidate.purged_at is None
                and candidate.run.status == RunStatus.SUPERSEDED):
            return candidate
        since, run_id = pub.id, candidate.run.run_id


def _in_effect(history: list[Publication], run_id: str) -> Publication | None:
    return next((p for p in history if p.version.run.run_id == run_id), None)


# -- permissions and input ----------------------------------------------------------------


def _require_operator(actor, *, datasets: list[Dataset], action: str, request_id: int | None = None,
                      object_type: str, object_id) -> None:
    if has_role(actor, Role.ONCALL, Role.ADMIN) or all(d.owner_id == actor.pk for d in datasets):
        return
    raise deny(actor=actor, action=action, reason=f"{action} needs on-call, an admin or the dataset owner",
               object_type=object_type, object_id=object_id, request_id=request_id,
               dataset=datasets[0].name if datasets else "")


def _reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ValidationError("say why you roll back; readers and auditors will ask", field="reason")
    return reason


def _dataset(name: str) -> Dataset:
    dataset = Dataset.objects.select_related("owner").filter(name=name).first()
    if dataset is None:
        raise NotFound(f"dataset {name!r} does not exist")
    if dataset.is_source:
        raise ValidationError(f"{name} is a source; it has no versions to roll back", field="dataset")
    return dataset


# -- planning ----------------------------------------------------------------------------------


def _plan_partition(dataset: Dataset, partition_key: str) -> Move:
    """Read the pointer and the history; refuse what cannot be rolled back (409)."""
    _repair_mirror(dataset, partition_key)
    current_run_id = get_warehouse().current(dataset.name, partition_key)
    if current_run_id is None:
        raise ConflictError(f"{dataset.name}/{partition_key} has no published version to roll back",
                            field="partition_key")
    history = _history(dataset, partition_key)
    pub = _in_effect(history, current_run_id)
    if pub is None:
        raise ConflictError(f"{dataset.name}/{partition_key}: the current version {current_run_id} is not in the "
                            "publication history; reconcile the metadata first", field="partition_key")
    if pub.action == Publication.Action.ROLLBACK:
        who = pub.actor.username if pub.actor_id else "system"
        raise ConflictError(
            f"{dataset.name}/{partition_key} was already rolled back to {current_run_id} by {who} at "
            f"{pub.published_at:%Y-%m-%d %H:%M}; publish a new version instead of rolling back again",
            field="partition_key")
    target = previous_verified(history, current_run_id)
    if target is None:
        raise ConflictError(f"{dataset.name}/{partition_key} has no previous verified version to roll back to",
                            field="partition_key")
    return Move(dataset=dataset, partition_key=partition_key, current=pub.version, target=target, request=None)


def _plan_request(request: BackfillRequest) -> list[Move]:
    """Every partition this request published and that still shows its version; any
    partition someone published since, or with nothing to go back to, refuses all."""
    latest: dict[tuple[int, str], Publication] = {}
    for pub in (Publication.objects.filter(request=request, action=Publication.Action.PUBLISH)
                .select_related("dataset__owner", "version__run").order_by("id")):
        latest[(pub.dataset_id, pub.partition_key)] = pub
    if not latest:
        raise ConflictError(f"request #{request.pk} published nothing; there is nothing to roll back", field="status")
    warehouse = get_warehouse()
    moves, conflicts, missing = [], [], []
    for pub in latest.values():
        dataset, key, mine = pub.dataset, pub.partition_key, pub.version
        _repair_mirror(dataset, key)
        mine.run.refresh_from_db(fields=["status"])
        current = warehouse.current(dataset.name, key)
        if current != mine.run.run_id:
            if mine.run.status == RunStatus.ROLLED_BACK:
                continue  # rolled back already (a partition rollback): nothing left to do here
            conflicts.append(f"{dataset.name}/{key} (now {current or 'nothing'})")
            continue
        target = previous_verified(_history(dataset, key), current)
        if target is None:
            missing.append(f"{dataset.name}/{key}")
            continue
        moves.append(Move(dataset=dataset, partition_key=key, current=mine, target=target, request=request))
    if conflicts:
        raise ConflictError(f"published since this request, not rolled back: {', '.join(sorted(conflicts))}; "
                            "nothing was changed", fields={"partitions": sorted(conflicts)})
    if missing:
        raise ConflictError(f"no previous verified version for {', '.join(sorted(missing))}; nothing was changed",
                            fields={"partitions": sorted(missing)})
    return sorted(moves, key=lambda m: (m.dataset.name, m.partition_key))


# -- applying -----------------------------------------------------------------------------------


def _move_pointers(moves: list[Move], *, actor) -> None:
    """In one warehouse transaction, compare-and-set every pointer back: one lost race
    rolls all of them back (PublishConflict, a 409), so nothing changed."""
    warehouse = get_warehouse()
    label = getattr(actor, "username", None) or "system"
    with warehouse.db.transaction():
        for move in moves:
            warehouse.rollback(name=move.dataset.name, partition=move.partition_key, to_run_id=move.target.run.run_id,
                               expected_run_id=move.current.run.run_id, actor=label)


def _mirror(moves: list[Move], *, actor, reason: str, then=None) -> None:
    """In one metadata transaction: the rollback publications, the run states, the audit
    rows, and whatever `then` does (the request's own transition)."""
    now = timezone.now()
    with transaction.atomic():
        for move in moves:
            bad, restored = move.current.run, move.target.run
            request = move.request or bad.request
            Publication.objects.create(
                dataset=move.dataset, partition_key=move.partition_key, version=move.target,
                previous_version=move.current, action=Publication.Action.ROLLBACK, actor=actor,
                request=request, published_at=now, reason=reason)
            run_transition(bad, to=RunStatus.ROLLED_BACK, actor=actor, reason=reason,
                           data={"restored": restored.run_id})
            run_transition(restored, to=RunStatus.PUBLISHED, actor=actor, reason=f"restored by rollback: {reason}",
                           data={"rolled_back": bad.run_id})
            audit_record(actor=actor, action="partition.rollback", object_type="partition",
                         object_id=f"{move.dataset.name}/{move.partition_key}",
                         request_id=request.pk if request else None, dataset=move.dataset.name,
                         from_state=bad.run_id, to_state=restored.run_id, reason=reason, data=move.as_dict())
        if then is not None:
            then()
    logger.info("rolled back %d partition(s): %s", len(moves),
                ", ".join(f"{m.dataset.name}/{m.partition_key}" for m in moves))


def _apply(moves: list[Move], *, actor, reason: str, then=None) -> None:
    """Warehouse first (the truth), then the mirror, as run_publish does; a crash in
    between is finished by `_repair_mirror` on the next attempt."""
    _move_pointers(moves, actor=actor)
    _mirror(moves, actor=actor, reason=reason, then=then)


def _repair_mirror(dataset: Dataset, partition_key: str) -> None:
    """If the warehouse's last pointer move is a rollback the metadata never recorded
    (the process died between the two steps), record it now."""
    records = get_warehouse().history(dataset.name, partition_key)
    if not records or records[0].action != "rollback" or not records[0].previous_run_id:
        return
    rec = records[0]
    if Publication.objects.filter(dataset=dataset, partition_key=partition_key, action=Publication.Action.ROLLBACK,
                                  version__run__run_id=rec.run_id,
                                  previous_version__run__run_id=rec.previous_run_id).exists():
        return
    versions = {v.run.run_id: v for v in Version.objects.filter(
        run__run_id__in=[rec.run_id, rec.previous_run_id]).select_related("run__request", "run__job__dataset")}
    if len(versions) != 2:
        return
    move = Move(dataset=dataset, partition_key=partition_key, current=versions[rec.previous_run_id],
                target=versions[rec.run_id], request=None)
    logger.warning("finishing the mirror of a rollback of %s/%s by %s", dataset.name, partition_key, rec.actor)
    _mirror([move], actor=None, reason=f"rollback by {rec.actor} at {rec.published_at:%Y-%m-%d %H:%M} "
                                       "(mirror finished after an interruption)")


# -- consumers --------------------------------------------------------------------------------


def consumers_of(versions: list[Version]) -> list[dict]:
    """Every run that read one of `versions` (its pinned consumption), with the dataset
    it produced, oldest first. Verification runs are included: they read it too."""
    rows = (Consumption.objects.filter(version__in=versions)
            .select_related("run__job__dataset", "version__run", "dataset").order_by("run_id", "id"))
    out: dict[int, dict] = {}
    for c in rows:
        entry = out.setdefault(c.run_id, {
            "run_id": c.run.run_id, "job": c.run.job.name, "dataset": c.run.job.dataset.name,
            "partition_key": c.run.partition_key, "status": c.run.status, "run_type": c.run.run_type,
            "request": c.run.request_id, "read": []})
        entry["read"].append({"dataset": c.dataset.name, "partition_key": c.partition_key,
                              "run_id": c.version.run.run_id})
    return list(out.values())


def _rolled_back_versions(*, request: BackfillRequest | None = None, dataset: Dataset | None = None,
                          partition_key: str | None = None) -> list[Version]:
    pubs = (Publication.objects.filter(action=Publication.Action.ROLLBACK)
            .select_related("previous_version__run__request", "previous_version__dataset").order_by("id"))
    if request is not None:
        pubs = pubs.filter(request=request)
    if dataset is not None:
        pubs = pubs.filter(dataset=dataset, partition_key=partition_key)
    return [p.previous_version for p in pubs if p.previous_version_id]


# -- services ----------------------------------------------------------------------------------


def partition_rollback(*, actor, dataset: str, partition_key: str, reason: str) -> dict:
    """Roll one partition back to its previous verified version. Returns the move and
    the consumers of the rolled-back version."""
    dataset_obj = _dataset(dataset)
    _require_operator(actor, datasets=[dataset_obj], action="partition.rollback", object_type="partition",
                      object_id=f"{dataset}/{partition_key}")
    reason = _reason(reason)
    move = _plan_partition(dataset_obj, partition_key)
    _apply([move], actor=actor, reason=reason)
    return {**move.as_dict(), "consumers": consumers_of([move.current])}


def request_rollback(*, actor, request_id, reason: str) -> dict:
    """Roll back every partition a request published, then the request itself.

    1. On-call, an admin or the owner of every dataset involved; a reason.
    2. Plan: each partition must still show this request's version and have a
       previous verified one; otherwise 409 and nothing changes.
    3. Move all pointers (one warehouse transaction), mirror, request -> rolled_back.
    """
    request = _get_request(request_id)
    datasets = list(Dataset.objects.filter(publications__request=request).distinct()) or [request.job.dataset]
    _require_operator(actor, datasets=datasets, action="request.rollback", object_type="request",
                      object_id=request.pk, request_id=request.pk)
    reason = _reason(reason)
    if request.status == RequestStatus.ROLLED_BACK:
        raise ConflictError(f"request #{request.pk} was already rolled back", field="status")
    if request.status not in ROLLBACKABLE_REQUEST_STATES:
        raise ConflictError(f"request #{request.pk} is {request.status}; only a reconciling, completed or failed "
                            "request can be rolled back", field="status")
    moves = _plan_request(request)
    _apply(moves, actor=actor, reason=reason, then=lambda: request_transition(
        request, to=RequestStatus.ROLLED_BACK, actor=actor, action="request.rollback", reason=reason,
        data={"partitions": [m.as_dict() for m in moves]}))
    bad = list(Version.objects.filter(run__request=request, run__status=RunStatus.ROLLED_BACK))
    return {"request": request.pk, "partitions": [m.as_dict() for m in moves], "consumers": consumers_of(bad)}


def _get_request(request_id) -> BackfillRequest:
    try:
        return BackfillRequest.objects.select_related("job__dataset__owner").get(pk=int(request_id))
    except (BackfillRequest.DoesNotExist, TypeError, ValueError):
        raise NotFound(f"backfill request {request_id} does not exist") from None


def rollback_state(*, request_id=None, dataset: str | None = None, partition_key: str | None = None) -> dict:
    """What a rollback did (or would touch): the rolled-back versions and their consumers."""
    if request_id is not None:
        request = _get_request(request_id)
        versions = _rolled_back_versions(request=request)
        return {"request": request.pk, "status": request.status,
                "rolled_back": [{"dataset": v.dataset.name, "partition_key": v.partition_key, "run_id": v.run.run_id}
                                for v in versions],
                "consumers": consumers_of(versions)}
    dataset_obj = _dataset(dataset)
    versions = _rolled_back_versions(dataset=dataset_obj, partition_key=partition_key)
    return {"dataset": dataset_obj.name, "partition_key": partition_key,
            "rolled_back": [v.run.run_id for v in versions], "consumers": consumers_of(versions)}


def _file_rebuilds(*, actor, consumers: list[dict], parent: BackfillRequest | None,
                   label: str) -> list[BackfillRequest]:
    """One request per consumer job over the partitions its affected runs produced,
    filed (created and submitted) by `actor`; the same click twice files nothing new."""
    from backfill_portal.backfills.services.requests import backfill_request_create, backfill_request_submit
    from backfill_portal.catalog.models import Job

    partitions: dict[str, set[str]] = {}
    for c in consumers:
        if c["run_type"] == "verification":
            continue
        partitions.setdefault(c["job"], set()).add(c["partition_key"])
    filed = []
    for job_name, keys in sorted(partitions.items()):
        job = Job.objects.select_related("dataset").get(name=job_name)
        if job.dataset.is_source:
            continue
        first, last = min(keys), max(keys)
        request, created = backfill_request_create(
            actor=actor, job=job_name, start=first, end=last, reason=f"rebuild after rollback of {label}",
            idempotency_key=f"rollback-rebuild:{label}:{job_name}:{first}:{last}")
        if created:  # the same click twice: the idempotency key returns the first request
            with transaction.atomic():
                BackfillRequest.objects.filter(pk=request.pk).update(parent=parent)
                audit_record(actor=actor, action="request.rebuild_after_rollback", object_type="request",
                             object_id=request.pk, request_id=request.pk, dataset=job.dataset.name,
                             reason=f"rebuild after rollback of {label}",
                             data={"parent": parent.pk if parent else None, "partitions": sorted(keys)})
        request.refresh_from_db()
        if request.status == RequestStatus.DRAFT:  # also finishes a click that died between the two steps
            request = backfill_request_submit(actor=actor, request_id=request.pk, confirm_overlap=True)
        filed.append(request)
    return filed


def rollback_rebuild(*, actor, request_id) -> list[BackfillRequest]:
    """The one-click cascade after a request rollback: file a request for each consumer
    job that read a rolled-back version, parent = the rolled-back request."""
    request = _get_request(request_id)
    _require_operator(actor, datasets=[request.job.dataset], action="rollback.rebuild", object_type="request",
                      object_id=request.pk, request_id=request.pk)
    versions = _rolled_back_versions(request=request)
    if not versions:
        raise ConflictError(f"request #{request.pk} has not been rolled back; there is nothing to rebuild",
                            field="status")
    consumers = consumers_of(versions)
    if not consumers:
        raise ConflictError(f"no run read the versions rolled back from request #{request.pk}; nothing to rebuild",
                            field="consumers")
    return _file_rebuilds(actor=actor, consumers=consumers, parent=request, label=f"#{request.pk}")


def partition_rollback_rebuild(*, actor, dataset: str, partition_key: str) -> list[BackfillRequest]:
    dataset_obj = _dataset(dataset)
    _require_operator(actor, datasets=[dataset_obj], action="rollback.rebuild", object_type="partition",
                      object_id=f"{dataset}/{partition_key}")
    versions = _rolled_back_versions(dataset=dataset_obj, partition_key=partition_key)
    if not versions:
        raise ConflictError(f"{dataset}/{partition_key} has not been rolled back; there is nothing to rebuild",
                            field="partition_key")
    consumers = consumers_of(versions)
    if not consumers:
        raise ConflictError(f"no run read the rolled-back version of {dataset}/{partition_key}; nothing to rebuild",
                            field="consumers")
    parent = versions[0].run.request
    return _file_rebuilds(actor=actor, consumers=consumers, parent=parent, label=f"{dataset}/{partition_key}")


__all__ = [
    "consumers_of",
    "partition_rollback",
    "partition_rollback_rebuild",
    "previous_verified",
    "request_rollback",
    "rollback_rebuild",
    "rollback_state",
]
