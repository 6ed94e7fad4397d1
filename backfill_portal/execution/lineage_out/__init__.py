"""OpenLineage out: every run tells the lineage world what it read, wrote and proved.

* `events.py` builds a run's event (openlineage-python's classes, the spec's facets)
  from what the metadata records: the pinned inputs (Consumption) with the exact
  versions read, the version written with its numbers and checks, the publication or
  rollback that moved the pointer.
* `outbox.py` owns `LineageEvent`: `lineage_transition` (called once, by
  `run_transition`, inside the transition's transaction) writes the event and enqueues
  its sending through the task outbox; `lineage_events_send` sends a run's unsent
  events in order under a lease; the sweeper sends again what was never sent.
* `transport.py` makes the transport from settings: HTTP (`OPENLINEAGE_URL`), a file
  (`OPENLINEAGE_FILE`), or none (the default: nothing is written at all).

docs/openlineage.md says which transition emits which event and what each facet holds.
"""
