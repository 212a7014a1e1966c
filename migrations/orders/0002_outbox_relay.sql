-- What the built-in relay records on outbox rows. Debezium ignores these
-- columns (they are not part of the Outbox Event Router's contract).

alter table outbox
    -- Failed publish attempts caused by the row itself (too large, no valid
    -- topic). Broker outages do not count: they are nobody's fault.
    add column attempts integer not null default 0,
    add column last_error text,
    -- Set after too many attempts: the relay skips the row from then on.
    -- Un-park with: update outbox set parked_at = null, attempts = 0 where id = ...
    add column parked_at timestamptz,
    -- Set on publish when the relay keeps published rows (--retain-published);
    -- by default it deletes them instead.
    add column published_at timestamptz;

-- The relay reads only rows still to publish, in insert order. A partial
-- index keeps that read as cheap with ten million published rows kept as
-- with none.
drop index outbox_seq_idx;
create index outbox_pending_idx on outbox (seq) where published_at is null and parked_at is null;

-- Purging retained rows by age.
create index outbox_published_at_idx on outbox (published_at) where published_at is not null;
