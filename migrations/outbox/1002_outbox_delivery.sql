-- Where each row went, as the built-in relay's delivery report said: the
-- relay deletes a published row by default, and `entrega journey` still
-- needs to know when it was published and which record it became. Written
-- in the statement that deletes (or marks) the row, so it costs no round
-- trip; Debezium writes nothing here (the journey then searches the
-- record's partition by key). Purged by the relay after --delivery-log-retention.
create table if not exists outbox_delivery (
    id            uuid not null,        -- the outbox row's id: header `id`
    aggregatetype text not null,
    aggregateid   text not null,        -- the record key
    type          text not null,
    written_at    timestamptz not null, -- the row's created_at
    topic         text not null,
    partition     integer not null,
    "offset"      bigint not null,
    published_at  timestamptz not null default now()
);

-- No primary key: a row published twice (a relay killed between the ack
-- and its commit publishes it again) is two deliveries.
create index if not exists outbox_delivery_id_idx on outbox_delivery (id);
create index if not exists outbox_delivery_aggregate_idx on outbox_delivery (aggregateid);
-- Appended in time order: a BRIN index is enough for the purge.
create index if not exists outbox_delivery_published_at_idx on outbox_delivery using brin (published_at);
