-- The transactional outbox, for any database whose service publishes events:
-- the service writes rows in its own transactions, a relay (or Debezium)
-- publishes them. Debezium's default Outbox Event Router column names.
--
-- The orders database had this table before it was shared (migrations
-- orders/0001-0004 built it step by step); this set creates the same table
-- where it is missing and changes nothing where it exists. A test compares
-- the two shapes column by column and index by index.
--
-- Versions 1000 and up, so they never collide with a service's own set;
-- both sets share the database's migration history.

create table if not exists outbox (
    id            uuid primary key,     -- the message id: Kafka header `id`
    aggregatetype text not null,        -- 'pedido' -> topic 'pedido.eventos'
    aggregateid   text not null,        -- the aggregate's id -> record key
    type          text not null,        -- the event type -> header 'eventType'
    payload       jsonb not null,       -- the record value
    created_at    timestamptz not null default now(),
    -- Insert order, for the relay. Values are taken at insert and commit out
    -- of order: a reader must never treat "seq <= last seen" as published.
    seq           bigint generated always as identity,
    -- W3C trace context of the work that wrote the row (header `traceparent`).
    traceparent   text check (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'),
    -- What the built-in relay records; Debezium ignores these columns.
    -- Failed publish attempts caused by the row itself (too large, no valid
    -- topic). Broker outages do not count: they are nobody's fault.
    attempts      integer not null default 0,
    last_error    text,
    -- Set after too many attempts: the relay skips the row from then on.
    parked_at     timestamptz,
    -- Set on publish when the relay keeps published rows (--retain-published).
    published_at  timestamptz,
    -- A row the broker did not take steps aside until then.
    next_attempt_at timestamptz,
    -- How often that happened: the wait doubles with each.
    deferrals     integer not null default 0
);

-- Rows still to publish, in insert order.
create index if not exists outbox_pending_idx on outbox (seq)
    where published_at is null and parked_at is null;
-- Purging retained rows by age.
create index if not exists outbox_published_at_idx on outbox (published_at)
    where published_at is not null;
-- Counting parked rows without reading the table.
create index if not exists outbox_parked_idx on outbox (parked_at)
    where parked_at is not null;
-- Per-aggregate order: "is an earlier row of this aggregate unpublished?"
create index if not exists outbox_pending_aggregate_idx on outbox (aggregatetype, aggregateid, seq)
    where published_at is null;
-- Deferred rows due for another try.
create index if not exists outbox_deferred_idx on outbox (seq)
    where published_at is null and parked_at is null and deferrals > 0;
