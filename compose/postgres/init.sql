-- Run once, as the superuser, when the stack's PostgreSQL is first started
-- (after 00-roles.sql, migrations/roles.sql: the group roles the grants
-- name). The databases belong to entrega_owner, which migrates them
-- (order-migrate, inventory-migrate); each part logs in as a role of its
-- own that owns nothing and is a member of its group. docs/security.md,
-- "Least privilege".
\getenv password ENTREGA_DB_PASSWORD

create role entrega_owner login password :'password';
create database orders owner entrega_owner;
create database inventory owner entrega_owner;

create role order_service login password :'password' in role entrega_order_service;
create role inventory_service login password :'password' in role entrega_inventory_service;
-- Both relays (orders, inventory): one login, so that a standby relay may
-- see and end its leader's session (docs/relay.md). REPLICATION for CDC mode.
create role outbox_relay login password :'password' replication in role entrega_relay;
-- The console (entrega), when run against the stack: reads, and the audit of
-- its redrives (CONSOLE_*_REDRIVE_DATABASE_URL).
create role console login password :'password' in role entrega_console;
alter role console set default_transaction_read_only = on;
create role console_redrive login password :'password' in role entrega_redrive;
-- Debezium's connectors (the debezium profile), in place of the relays:
-- they read the outbox and stream the publication `migrate` made.
create role debezium login password :'password' replication in role entrega_debezium;
