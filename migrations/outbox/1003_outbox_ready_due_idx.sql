-- The relay's read walks only rows it may take (services/outbox-relay,
-- store.rs): rows never deferred in insert order, and deferred rows in the
-- order their wait ends. Before, both walks went over every pending row, so
-- a broken topic's backlog of deferred rows made every read as slow as the
-- backlog was long (issue 34, items 4 and 13).
create index if not exists outbox_ready_idx on outbox (seq)
    where published_at is null and parked_at is null and deferrals = 0;
create index if not exists outbox_due_idx on outbox (next_attempt_at)
    where published_at is null and parked_at is null and deferrals > 0;
