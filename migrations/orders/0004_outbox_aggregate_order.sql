-- Per-aggregate order, enforced by the built-in relay (Debezium ignores
-- these columns and this index).
--
-- A row is read only when no earlier row of its aggregate is still
-- unpublished (parked ones included): this index answers "is there one?"
-- for each candidate row of a read, and lists what a parked row holds back.
create index outbox_pending_aggregate_idx on outbox (aggregatetype, aggregateid, seq)
    where published_at is null;

alter table outbox
    -- A row the broker did not take (broker, topic or network fault: not
    -- the row's) steps aside until then, so that rows behind it are read.
    add column next_attempt_at timestamptz,
    -- How often that happened: the wait doubles with each, up to
    -- --max-backoff. Not attempts: it never parks a row.
    add column deferrals integer not null default 0;

-- Deferred rows due for another try, in insert order (usually none).
create index outbox_deferred_idx on outbox (seq)
    where published_at is null and parked_at is null and deferrals > 0;
