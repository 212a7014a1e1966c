-- Grants on the tables every service database has (migrations/outbox and
-- migrations/consumer), applied by `<service> migrate` after the
-- migrations, as the database's owner. {service} is the group role of the
-- database's own service (entrega_order_service or entrega_inventory_service).
-- The roles come from migrations/roles.sql. Every statement is idempotent.
-- docs/security.md, "Least privilege", explains each line.

-- The service: writes its events; records what it consumed (the dedupe
-- insert returns nothing but the conflict check reads; the purge deletes).
grant insert (id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext)
    on outbox to {service};
grant select, delete, insert (consumidor, mensagem_id) on mensagem_processada to {service};
-- Serving with *_NO_MIGRATE checks that the schema is current.
grant select (version, success) on _sqlx_migrations to {service};

-- The relay: reads and publishes the outbox, marks or deletes what it
-- published, parks and defers what failed, and logs deliveries (checked
-- with has_table_privilege at start-up: a table-level grant). The insert
-- is CDC mode's alone: it writes back a row it read from the WAL to park
-- or defer it; poll mode never inserts.
grant select, delete,
      update (published_at, attempts, last_error, parked_at, deferrals, next_attempt_at),
      insert (id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext,
              attempts, last_error, parked_at, deferrals, next_attempt_at)
    on outbox to entrega_relay;
grant select, insert, delete on outbox_delivery to entrega_relay;

-- The console: reads; never an event's payload or trace context.
grant select (id, aggregatetype, aggregateid, type, created_at, seq, attempts, last_error,
              parked_at, published_at, deferrals, next_attempt_at)
    on outbox to entrega_console;
grant select on outbox_delivery, mensagem_processada, dlt_redrive to entrega_console;

-- The redrive audit (the console's redrive URL, a service's `dlt redrive`):
-- one insert, checked with has_table_privilege (a table-level grant).
grant insert on dlt_redrive to entrega_redrive;

-- Debezium, in place of the relay (debezium/*.json): its snapshot reads
-- the outbox (select, and lock … in access share mode, which needs select);
-- it streams through the publication below and writes nothing. Its login
-- needs REPLICATION as well. A table grant: its snapshot selects every
-- column it does not exclude, and the EventRouter needs none of the others.
grant select on outbox to entrega_debezium;

-- CDC mode: the publication a relay streams (its default name,
-- RELAY_CDC_PUBLICATION), and Debezium's (publication.autocreate.mode
-- disabled). Only the table's owner may create it; a relay
-- that finds it creates nothing. Its login needs REPLICATION as well
-- (alter role … replication: an attribute, which membership does not pass on).
do $$
begin
    if not exists (select from pg_publication where pubname = 'entrega_outbox') then
        create publication entrega_outbox for table outbox with (publish = 'insert');
    end if;
end
$$;
