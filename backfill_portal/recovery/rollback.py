"""Rollback: move a partition's pointer back to its previous verified version.

The previous verified version is the one the current version replaced, walking the
publication history back past versions that were themselves rolled back. The move is
the warehouse's compare-and-set (`Warehouse.rollback`): if someone published since we
read the pointer, it is a conflict shown to the user, never an overwrite. The metadata
then mirrors it: a Publication(action=rollback), the current run -> rolled_back, the
restored run superseded -> published, and audit rows, in one transaction.

The rollback's impact is its contaminated closure: every version published at that
moment whose pinned inputs include a rolled-back version, directly or through other
versions (consumption records, walked level by level; a `depends_on_past` partition
reads its previous partition, so the later partitions of a cumulative dataset follow).
It is recorded (Contamination) in the same transaction as the rollback, marks each
partition until it is rebuilt, reopens a completed request whose output it names, and
`rollback_rebuild` files ONE request that rebuilds exactly that set in layer order on
the restored inputs - once, however often it is asked for. The consumer runs that read
a rolled-back version directly are still listed (`consumers`). A rolled-back version
is kept for diagnosis (see retention.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.backfills.policy import ROLLBACKABLE_REQUEST_STATES, request_rollback_datasets, require_roll_back
from backfill_portal.backfills.selectors import request_get
from backfill_portal.backfills.services.lifecycle import request_reopen, request_rolled_back
from backfill_portal.backfills.services.requests import NodeAction
from backfill_portal.catalog.models import Dataset
from backfill_portal.core.errors import ConflictError, NotFound, ValidationError
from backfill_portal.core.retry import run_again_if_deadlocked
from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.execution.queue import enqueue
from backfill_portal.execution.transitions import run_transition
from backfill_portal.recovery.locks import serialise_reconciliation, serialise_rollbacks
from backfill_portal.recovery.reconciliation import reconciliation_signoff_withdraw
from backfill_portal.warehouse.models import Consumption, Contamination, Publication, Version
from backfill_portal.backends import PointerMove, get_warehouse
from backfill_portal.warehouse.selectors import contamination_status, publications_in_effect

logger = logging.getLogger(__name__)


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
    label = getattr(actor, "username", None) or "system"
    get_warehouse().rollback_many(
        [PointerMove(name=move.dataset.name, partition=move.partition_key, to_run_id=move.target.run.run_id,
                     expected_run_id=move.current.run.run_id) for move in moves],
        actor=label)


def _mirror(moves: list[Move], *, actor, reason: str, then=None) -> None:
    """In one metadata transaction: the rollback publications, the run states, the audit
    rows, and whatever `then` does (the request's own transition)."""
    now = timezone.now()
    with transaction.atomic():
        pubs: dict[int, Publication] = {}
        for move in moves:
            bad, restored = move.current.run, move.target.run
            request = move.request or bad.request
            pubs[move.current.pk] = Publication.objects.create(
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
        _record_closure(moves, pubs, actor=actor, reason=reason, now=now)
        if then is not None:
            then()
        else:
            _reconcile_again({m.current.run.request_id: m.current.run.request for m in moves
                              if m.current.run.request_id}, actor=actor, reason=reason)
    logger.info("rolled back %d partition(s): %s", len(moves),
                ", ".join(f"{m.dataset.name}/{m.partition_key}" for m in moves))


def _apply(moves: list[Move], *, actor, reason: str, then=None, before=None) -> None:
    """Warehouse first (the truth), then the mirror, as run_publish does; a crash in
    between is finished by `_repair_mirror` on the next attempt. Both under the rollback
    lock: a second click that looked while the first was between them took the first's
    move for an interruption, recorded it as the system's, and both were told 409.

    The rows the mirror changes are locked before the warehouse moves, so a deadlock
    (a worker holding one of them while it waits for the audit chain, which the mirror's
    first audit row holds) breaks before anything moved, and the whole of it runs again;
    afterwards the mirror waits only for the audit chain, whose holders wait for none of
    these rows."""

    def attempt() -> None:
        with transaction.atomic():
            serialise_rollbacks()
            # The reconciliations this rollback will reopen or recompute, before any row: in
            # the order a recompute and a sign-off take them (recovery/locks.py).
            for request_id in sorted({m.current.run.request_id for m in moves if m.current.run.request_id}):
                serialise_reconciliation(request_id)
            if before is not None:
                before()  # what must still hold, checked under the lock, before the warehouse moves
            _lock_mirrored_rows(moves)
            _move_pointers(moves, actor=actor)
            try:
                _mirror(moves, actor=actor, reason=reason, then=then)
            except DatabaseError as exc:  # the warehouse moved: never again; `_repair_mirror` finishes the record
                raise _MovedThenFailed() from exc

    try:
        run_again_if_deadlocked(attempt, what="a rollback")
    except _MovedThenFailed as wrapped:
        raise wrapped.__cause__ from None


class _MovedThenFailed(Exception):
    """The mirror failed after the warehouse moved: not to be run again (the compare-and-set
    would find its own move)."""


def _lock_mirrored_rows(moves: list[Move]) -> None:
    """The runs (rolled back and restored) and requests the mirror changes, locked in id order."""
    run_ids = sorted({m.current.run_id for m in moves} | {m.target.run_id for m in moves})
    list(Run.objects.select_for_update().filter(pk__in=run_ids).order_by("pk").values_list("pk", flat=True))
    request_ids = sorted({m.current.run.request_id for m in moves if m.current.run.request_id}
                         | {m.request.pk for m in moves if m.request is not None})
    list(BackfillRequest.objects.select_for_update().filter(pk__in=request_ids).order_by("pk")
         .values_list("pk", flat=True))


def _repair_mirror(dataset: Dataset, partition_key: str) -> None:
    """If the warehouse's last pointer move is a rollback the metadata never recorded
    (the process died between the two steps), record it now; a rollback still between
    them is waited for (the rollback lock), not finished in its place."""
    with transaction.atomic():
        serialise_rollbacks()
        _repair_mirror_locked(dataset, partition_key)


def _repair_mirror_locked(dataset: Dataset, partition_key: str) -> None:
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


# -- the contaminated closure --------------------------------------------------------------


@dataclass
class Contaminated:
    """A published version built from `root` (a rolled-back version), reached through
    its input `via` after `depth` consumption steps."""

    version: Version
    depth: int
    via: Version
    root: Version


def contaminated_closure(rolled_back: list[Version]) -> list[Contaminated]:
    """Every version published now whose pinned inputs include one of `rolled_back`,
    transitively through consumption records, nearest first (one query pair a level).

    The walk goes through versions that are no longer published too (an ads version
    built from a dws version that was replaced since is still built from bad data),
    but only published ones are entries: they are what readers see. Verification runs
    are not followed: nobody reads their versions."""
    known: dict[int, Version] = {v.pk: v for v in rolled_back}
    root_of: dict[int, Version] = {v.pk: v for v in rolled_back}
    frontier = list(known)
    entries: list[Contaminated] = []
    depth = 0
    while frontier:
        depth += 1
        read: dict[int, int] = {}  # consumer run pk -> the input version it was reached through
        for version_id, run_id in (Consumption.objects.filter(version_id__in=frontier)
                                   .exclude(run__run_type=RunType.VERIFICATION)
                                   .order_by("version_id", "run_id").values_list("version_id", "run_id")):
            read.setdefault(run_id, version_id)
        frontier = []
        for version in (Version.objects.filter(run_id__in=list(read))
                        .select_related("run__job", "run__request", "dataset").order_by("id")):
            if version.pk in known:
                continue
            via = known[read[version.run_id]]
            known[version.pk], root_of[version.pk] = version, root_of[via.pk]
            frontier.append(version.pk)
            if version.run.status == RunStatus.PUBLISHED:
                entries.append(Contaminated(version=version, depth=depth, via=via, root=root_of[via.pk]))
    return entries


def _ref(version: Version) -> dict:
    return {"dataset": version.dataset.name, "partition_key": version.partition_key, "run_id": version.run.run_id}


def impact_preview(versions: list[Version]) -> list[dict]:
    """What rolling back `versions` would contaminate (the confirmation page)."""
    return [{**_ref(e.version), "job": e.version.run.job.name, "request": e.version.run.request_id,
             "depth": e.depth, "via": _ref(e.via), "rolled_back": _ref(e.root)}
            for e in contaminated_closure(versions)]


def _record_closure(moves: list[Move], pubs: dict[int, Publication], *, actor, reason: str, now) -> None:
    """Inside the rollback's transaction: one Contamination row per entry of the
    closure, an audit row naming it, and each completed request whose published output
    it names reopened (completed -> reconciling, its sign-off withdrawn) so that its
    reconciliation shows the interval unexplained."""
    closure = contaminated_closure([m.current for m in moves])
    if not closure:
        return
    Contamination.objects.bulk_create([
        Contamination(rollback=pubs[e.root.pk], rolled_back=e.root, version=e.version, dataset=e.version.dataset,
                      partition_key=e.version.partition_key, depth=e.depth, via=e.via, found_at=now)
        for e in closure], ignore_conflicts=True)
    first = moves[0]
    request = first.request or first.current.run.request
    audit_record(actor=actor, action="rollback.contaminated", object_type="request" if first.request else "partition",
                 object_id=first.request.pk if first.request else f"{first.dataset.name}/{first.partition_key}",
                 request_id=request.pk if request else None, dataset=first.dataset.name, reason=reason,
                 data={"count": len(closure), "closure": [
                     f"{e.version.dataset.name}/{e.version.partition_key}@{e.version.run.run_id} depth {e.depth} "
                     f"via {e.via.run.run_id}" for e in closure[:500]]})
    _reconcile_again({e.version.run.request_id: e.version.run.request for e in closure if e.version.run.request_id},
                     actor=actor, reason=reason)


def _reconcile_again(requests: dict[int, BackfillRequest], *, actor, reason: str) -> None:
    """Requests whose published output a rollback took away or named: a completed one is
    reopened (completed -> reconciling, its sign-off withdrawn) and each reconciling one
    recomputed, so its reconciliation shows the interval unexplained, not "matched"."""
    for pk, req in sorted(requests.items()):
        # As it is now, under the rollback lock a sign-off also takes: one that completed
        # it since it was read is withdrawn here, not left signed over a changed partition.
        req.refresh_from_db(fields=["status", "finished_at"])
        if req.status == RequestStatus.COMPLETED:
            signed = reconciliation_signoff_withdraw(request=req)
            request_reopen(req, actor=actor, reason=reason, signed_off=signed)
        if req.status == RequestStatus.RECONCILING:
            enqueue("backfills.reconcile_request", pk, headers={"request_id": pk})


def closure_entries(rows) -> list[dict]:
    """The recorded closure with where each entry stands, nearest first; a version
    reached from two rolled-back versions is listed once, at its smallest depth."""
    rows = list(rows.select_related("version__run__job", "via__run", "via__dataset", "rolled_back__run",
                                    "rolled_back__dataset", "dataset", "rebuild").order_by("depth", "id"))
    current = publications_in_effect(rows)
    out, seen = [], set()
    for r in rows:
        if r.version_id in seen:
            continue
        seen.add(r.version_id)
        status = _status(r, current.get((r.dataset_id, r.partition_key)))
        out.append({"dataset": r.dataset.name, "partition_key": r.partition_key, "run_id": r.version.run.run_id,
                    "job": r.version.run.job.name, "request": r.version.run.request_id, "depth": r.depth,
                    "via": _ref(r.via), "rolled_back": _ref(r.rolled_back),
                    "rebuild_request": r.rebuild_id, "rebuild_skips": _rebuild_skips(r), **status})
    return out


def _rebuild_skips(row: Contamination) -> bool:
    """Whether the rebuild filed for this entry leaves its job out (node action `skip`,
    e.g. a side-effect node not authorised): that request will not clear the mark."""
    rebuild = row.rebuild
    return rebuild is not None and (rebuild.node_actions or {}).get(row.version.run.job.name) == NodeAction.SKIP


def _status(row: Contamination, current) -> dict:
    """contamination_status, told that a pending mark's rebuild skips its job: "rebuild
    pending (#N)" would promise a rebuild that request never makes."""
    status = contamination_status(row, current)
    if status["state"] == "pending" and _rebuild_skips(row):
        status["message"] = (f"built from a rolled-back input: not being rebuilt "
                             f"(#{row.rebuild_id} skips {row.version.run.job.name})")
    return status


def partition_contamination(*, dataset: Dataset, partition_key: str) -> dict | None:
    """The mark a partition carries while (and after) it was built from a rolled-back
    input: the newest closure entry of this partition, with where it stands."""
    rows = list(Contamination.objects.filter(dataset=dataset, partition_key=partition_key)
                .select_related("version__run__job", "via__run", "via__dataset", "rolled_back__run",
                                "rolled_back__dataset", "dataset", "rebuild").order_by("-id"))
    if not rows:
        return None
    current = publications_in_effect(rows[:1]).get((dataset.pk, partition_key))
    row = next((r for r in rows if current is not None and r.version_id == current.version_id), rows[0])
    return {"run_id": row.version.run.run_id, "depth": row.depth, "via": _ref(row.via),
            "rolled_back": _ref(row.rolled_back), "rebuild_request": row.rebuild_id,
            "rebuild_skips": _rebuild_skips(row), "job": row.version.run.job.name, "found_at": row.found_at,
            **_status(row, current)}


# -- services ----------------------------------------------------------------------------------


def _closure_of(*, request: BackfillRequest | None = None, dataset: Dataset | None = None,
                partition_key: str | None = None):
    rows = Contamination.objects.all()
    if request is not None:
        return rows.filter(rollback__request=request)
    return rows.filter(rollback__dataset=dataset, rollback__partition_key=partition_key)


def built_from_rolled_back(version: Version | None) -> bool:
    """Whether `version` is in some rollback's contaminated closure (the confirmation
    page warns before a rollback restores such a version)."""
    return version is not None and Contamination.objects.filter(version=version).exists()


def _restored_tainted(moves: list[Move]) -> list[dict]:
    """The moves whose restored version was itself built from a rolled-back input (the
    rollback of a rebuild goes back to what the rebuild replaced): readers see it again,
    its partition is marked again, and the rebuild's rollback must say so."""
    tainted = set(Contamination.objects.filter(version__in=[m.target for m in moves])
                  .values_list("version_id", flat=True))
    return [m.as_dict() for m in moves if m.target.pk in tainted]


def require_partition_rollback(*, actor, dataset: str, partition_key: str) -> Dataset:
    """The dataset (404 if unknown), if `actor` may roll its partitions back (else an
    audited 403)."""
    dataset_obj = _dataset(dataset)
    require_roll_back(actor, [dataset_obj], action="partition.rollback", object_type="partition",
                      object_id=f"{dataset}/{partition_key}")
    return dataset_obj


def partition_rollback(*, actor, dataset: str, partition_key: str, reason: str) -> dict:
    """Roll one partition back to its previous verified version. Returns the move,
    the consumers of the rolled-back version and the contaminated closure."""
    dataset_obj = require_partition_rollback(actor=actor, dataset=dataset, partition_key=partition_key)
    reason = _reason(reason)
    move = _plan_partition(dataset_obj, partition_key)
    _apply([move], actor=actor, reason=reason)
    impact = closure_entries(Contamination.objects.filter(rolled_back=move.current))
    return {**move.as_dict(), "consumers": consumers_of([move.current]), "impact": impact,
            "restored_tainted": _restored_tainted([move])}


def request_rollback(*, actor, request_id, reason: str) -> dict:
    """Roll back every partition a request published, then the request itself.

    1. On-call, an admin or the owner of every dataset involved; a reason.
    2. Plan: each partition must still show this request's version and have a
       previous verified one; otherwise 409 and nothing changes.
    3. Move all pointers (one warehouse transaction), mirror, record the closure,
       request -> rolled_back.
    """
    request = request_get(request_id)
    require_roll_back(actor, request_rollback_datasets(request), action="request.rollback", object_type="request",
                      object_id=request.pk, request_id=request.pk)
    reason = _reason(reason)
    if request.status == RequestStatus.ROLLED_BACK:
        raise ConflictError(f"request #{request.pk} was already rolled back", field="status")
    if request.status not in ROLLBACKABLE_REQUEST_STATES:
        raise ConflictError(f"request #{request.pk} is {request.status}; only a reconciling, completed, failed or "
                            "cancelled request can be rolled back", field="status")
    moves = _plan_request(request)
    if request.status == RequestStatus.CANCELLED:
        # What it published before the cancel goes back; the request stays cancelled (an
        # exit of its lifecycle), and this audit row says what its rollback moved.
        if not moves:
            raise ConflictError(f"request #{request.pk}'s publications were rolled back already", field="status")
        _apply(moves, actor=actor, reason=reason, then=lambda: audit_record(
            actor=actor, action="request.rollback", object_type="request", object_id=request.pk,
            request_id=request.pk, dataset=request.job.dataset.name, from_state=request.status,
            to_state=request.status, reason=reason, data={"partitions": [m.as_dict() for m in moves]}))
    else:
        _apply(moves, actor=actor, reason=reason, before=lambda: _still_rollbackable(request),
               then=lambda: request_rolled_back(request, actor=actor, reason=reason,
                                                partitions=[m.as_dict() for m in moves]))
    bad = list(Version.objects.filter(run__request=request, run__status=RunStatus.ROLLED_BACK))
    return {"request": request.pk, "partitions": [m.as_dict() for m in moves], "consumers": consumers_of(bad),
            "impact": closure_entries(_closure_of(request=request)), "restored_tainted": _restored_tainted(moves)}


def _still_rollbackable(request: BackfillRequest) -> None:
    """Under the rollback lock, before the warehouse moves: the request's row locked and
    read again. A sign-off that completed it meanwhile left the copy read before stale,
    so its transition failed after the pointers had moved (a 409, the data rolled back
    anyway, and the move recorded later as the system's)."""
    list(BackfillRequest.objects.select_for_update().filter(pk=request.pk).values_list("pk", flat=True))
    request.refresh_from_db(fields=["status", "finished_at"])
    if request.status == RequestStatus.ROLLED_BACK:
        raise ConflictError(f"request #{request.pk} was rolled back meanwhile", field="status")
    if request.status not in ROLLBACKABLE_REQUEST_STATES or request.status == RequestStatus.CANCELLED:
        raise ConflictError(f"request #{request.pk} is {request.status} now; nothing was changed", field="status")


def rollback_state(*, request_id=None, dataset: str | None = None, partition_key: str | None = None) -> dict:
    """What a rollback did: the rolled-back versions, their consumers, and the whole
    contaminated closure with where each entry stands (pending / rebuilt by #N)."""
    if request_id is not None:
        request = request_get(request_id)
        versions = _rolled_back_versions(request=request)
        return {"request": request.pk, "status": request.status,
                "rolled_back": [{"dataset": v.dataset.name, "partition_key": v.partition_key, "run_id": v.run.run_id}
                                for v in versions],
                "consumers": consumers_of(versions), "impact": closure_entries(_closure_of(request=request))}
    dataset_obj = _dataset(dataset)
    versions = _rolled_back_versions(dataset=dataset_obj, partition_key=partition_key)
    return {"dataset": dataset_obj.name, "partition_key": partition_key,
            "rolled_back": [v.run.run_id for v in versions], "consumers": consumers_of(versions),
            "impact": closure_entries(_closure_of(dataset=dataset_obj, partition_key=partition_key))}


def request_rollback_blocked(request: BackfillRequest, *, shown: int = 5) -> tuple[int, list[str]]:
    """The partitions a rollback of `request` would certainly refuse (409, nothing
    changed), from the metadata alone, so the request page can say so instead of
    offering it: those still showing this request's version that was their first
    publication, with no earlier version at all to go back to. (How many, up to `shown`
    of their names.) Two indexed reads at most; the other refusals (an earlier version
    since purged or rolled back, a publication since) need the warehouse's pointer and
    each partition's history, which `_plan_request` reads only when asked."""
    first = (Publication.objects.filter(request=request, action=Publication.Action.PUBLISH,
                                        previous_version__isnull=True, version__run__status=RunStatus.PUBLISHED)
             .order_by("dataset__name", "partition_key"))
    names = [f"{name}/{key}" for name, key in first.values_list("dataset__name", "partition_key")[:shown]]
    return (first.count() if len(names) == shown else len(names)), names


# A rebuild request that ended without replacing what it was filed for (rolled back
# itself, cancelled, rejected, failed): its entries are open again, so the next click
# files a new rebuild instead of handing back the dead one.
ENDED_REBUILD = (RequestStatus.ROLLED_BACK, RequestStatus.CANCELLED, RequestStatus.REJECTED, RequestStatus.FAILED)


class _LostRace(Exception):
    """Another click claimed the closure first: undo this one's request."""


@dataclass(frozen=True)
class RebuildFiled:
    """The request(s) rebuilding a rollback's closure, in id order, and whether this call
    filed one (`new`) or an earlier or concurrent click had (the API's 201 or 200)."""

    requests: list[BackfillRequest]
    new: bool

    def __iter__(self):
        return iter(self.requests)

    def __len__(self) -> int:
        return len(self.requests)


def _file_rebuild(*, actor, rows, parent: BackfillRequest | None, label: str) -> RebuildFiled:
    """ONE request rebuilding every entry of the closure that readers still see and no
    rebuild covers yet, filed (created and submitted) by `actor`; the entries are
    claimed for it with a conditional update in the same transaction, so a second
    click, or a concurrent one, files nothing and returns the request(s) filed.

    1. An entry whose version a rebuild filed from another rollback already covers is
       given that request instead (it is not rebuilt twice).
    2. The rest: {job: partitions} -> backfill_request_create_partitions (one request,
       layer order, the normal approval steps), claimed, audited, submitted."""
    from backfill_portal.backfills.services.rebuild import backfill_request_create_partitions
    from backfill_portal.backfills.services.requests import backfill_request_submit

    rows = list(rows.select_related("version__run__job", "dataset", "rebuild").order_by("depth", "id"))
    open_rows = [r for r in rows if r.rebuild_id is None or r.rebuild.status in ENDED_REBUILD]
    current = publications_in_effect(open_rows) if open_rows else {}
    visible = [r for r in open_rows if (c := current.get((r.dataset_id, r.partition_key))) is not None
               and c.version_id == r.version_id]
    covered = dict(Contamination.objects.filter(version_id__in=[r.version_id for r in visible], rebuild__isnull=False)
                   .exclude(rebuild__status__in=ENDED_REBUILD).values_list("version_id", "rebuild_id"))
    todo = [r for r in visible if r.version_id not in covered]
    unclaimed = Q(rebuild__isnull=True) | Q(rebuild__status__in=ENDED_REBUILD)
    new = False
    try:
        with transaction.atomic():
            for r in visible:
                if r.version_id in covered:
                    Contamination.objects.filter(unclaimed, pk=r.pk).update(rebuild_id=covered[r.version_id])
            if todo:
                partitions: dict[str, set[str]] = {}
                for r in todo:
                    partitions.setdefault(r.version.run.job.name, set()).add(r.partition_key)
                reason = f"rebuild after rollback of {label}"
                request = backfill_request_create_partitions(
                    actor=actor, partitions={k: sorted(v) for k, v in partitions.items()}, reason=reason,
                    parent=parent)
                claimed = Contamination.objects.filter(unclaimed, pk__in=[r.pk for r in todo]).update(rebuild=request)
                if claimed != len(todo):
                    raise _LostRace
                audit_record(actor=actor, action="request.rebuild_after_rollback", object_type="request",
                             object_id=request.pk, request_id=request.pk, dataset=request.job.dataset.name,
                             reason=reason, data={"parent": parent.pk if parent else None,
                                                  "partitions": {k: sorted(v) for k, v in sorted(partitions.items())}})
                backfill_request_submit(actor=actor, request_id=request.pk, confirm_overlap=True)
                new = True
    except _LostRace:
        logger.info("rebuild after rollback of %s was filed by a concurrent click", label)
    ids = sorted({pk for pk in Contamination.objects.filter(pk__in=[r.pk for r in rows], rebuild__isnull=False)
                  .values_list("rebuild_id", flat=True)})
    if not ids:
        raise ConflictError(f"every partition built from the rollback of {label} was republished since; "
                            "nothing is left to rebuild", field="consumers")
    return RebuildFiled(list(BackfillRequest.objects.filter(pk__in=ids).select_related("job__dataset").order_by("pk")),
                        new=new)


def rollback_rebuild(*, actor, request_id) -> RebuildFiled:
    """The one-click cascade after a request rollback: one request rebuilding the whole
    contaminated closure, parent = the rolled-back request."""
    request = request_get(request_id)
    require_roll_back(actor, [request.job.dataset], action="rollback.rebuild", object_type="request",
                      object_id=request.pk, request_id=request.pk)
    versions = _rolled_back_versions(request=request)
    if not versions:
        raise ConflictError(f"request #{request.pk} has not been rolled back; there is nothing to rebuild",
                            field="status")
    rows = _closure_of(request=request)
    if not rows.exists():
        raise ConflictError(f"no published version was built from what request #{request.pk} rolled back; "
                            "nothing to rebuild", field="consumers")
    return _file_rebuild(actor=actor, rows=rows, parent=request, label=f"#{request.pk}")


def partition_rollback_rebuild(*, actor, dataset: str, partition_key: str) -> RebuildFiled:
    dataset_obj = _dataset(dataset)
    require_roll_back(actor, [dataset_obj], action="rollback.rebuild", object_type="partition",
                      object_id=f"{dataset}/{partition_key}")
    versions = _rolled_back_versions(dataset=dataset_obj, partition_key=partition_key)
    if not versions:
        raise ConflictError(f"{dataset}/{partition_key} has not been rolled back; there is nothing to rebuild",
                            field="partition_key")
    rows = _closure_of(dataset=dataset_obj, partition_key=partition_key)
    if not rows.exists():
        raise ConflictError(f"no published version was built from the rolled-back version of "
                            f"{dataset}/{partition_key}; nothing to rebuild", field="consumers")
    parent = versions[0].run.request
    return _file_rebuild(actor=actor, rows=rows, parent=parent, label=f"{dataset}/{partition_key}")


__all__ = [
    "Contaminated",
    "RebuildFiled",
    "built_from_rolled_back",
    "closure_entries",
    "consumers_of",
    "contaminated_closure",
    "impact_preview",
    "partition_contamination",
    "partition_rollback",
    "partition_rollback_rebuild",
    "previous_verified",
    "request_rollback",
    "require_partition_rollback",
    "rollback_rebuild",
    "rollback_state",
]
