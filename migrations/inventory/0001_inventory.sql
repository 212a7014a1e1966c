-- The inventory service's database: stock per sku, one reservation outcome
-- per order, and the idempotent consumer's record of processed messages.

create table stock (
    sku        text primary key check (sku ~ '^[A-Z0-9-]{1,64}$'),
    -- Units free to reserve. Never negative: the constraint, not the code,
    -- is the last word, so no bug and no concurrent writer can oversell.
    available  integer not null check (available >= 0),
    -- Units reserved by orders so far.
    reserved   integer not null default 0 check (reserved >= 0),
    updated_at timestamptz not null default now()
);

-- One outcome per order, all or nothing: RESERVED (every item reserved) or
-- REJECTED (nothing reserved, with the reason).
create table reservations (
    order_id   uuid primary key,
    status     text not null check (status in ('RESERVED', 'REJECTED')),
    reason     text,
    -- The message that produced the outcome.
    message_id uuid not null,
    created_at timestamptz not null default now(),
    check ((status = 'REJECTED') = (reason is not null))
);

create table reservation_items (
    order_id uuid not null references reservations (order_id) on delete cascade,
    -- Position in the event: items keep the order they arrived in.
    line     smallint not null check (line >= 0),
    sku      text not null,
    quantity integer not null check (quantity between 1 and 10000),
    primary key (order_id, line)
);

-- The idempotent consumer's dedupe table (design.md). A row is inserted
-- first in the transaction that applies the message's effect: the primary
-- key decides which delivery of a message wins, and a duplicate inserts
-- nothing and changes nothing.
create table mensagem_processada (
    consumidor    text not null,
    mensagem_id   uuid not null,
    processada_em timestamptz not null default now(),
    primary key (consumidor, mensagem_id)
);

-- Retention deletes by age, a batch at a time.
create index mensagem_processada_processada_em_idx on mensagem_processada (processada_em);
