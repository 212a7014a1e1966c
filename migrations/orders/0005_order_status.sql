-- Orders leave PENDING: the inventory's outcome flows back on
-- estoque.eventos (consumer `pedido.status`), and orders can be cancelled.
--
--   PENDING -> CONFIRMED | REJECTED (with the inventory's reason)
--   PENDING | CONFIRMED -> CANCELLED
--
-- Transitions are conditional updates (`where status = any(<allowed from>)`),
-- so a late or repeated event never moves an order backwards.

alter table orders drop constraint orders_status_check;
alter table orders
    add constraint orders_status_check
        check (status in ('PENDING', 'CONFIRMED', 'REJECTED', 'CANCELLED')),
    -- Why the order is in its status (the rejection's reason), if anything.
    add column status_reason text check (char_length(status_reason) <= 1000);

-- Every status an order has been in, in order, with the message that
-- caused it: the order's own PedidoCriado for PENDING, the inventory's event
-- for CONFIRMED and REJECTED, the PedidoCancelado for CANCELLED.
create table order_status_history (
    order_id   uuid not null references orders (id) on delete cascade,
    position   bigint generated always as identity,
    status     text not null,
    reason     text,
    -- Orders placed before this table existed have their PENDING row
    -- without one.
    message_id uuid,
    changed_at timestamptz not null default clock_timestamp(),
    primary key (order_id, position)
);

insert into order_status_history (order_id, status, changed_at)
select id, status, created_at from orders;

-- The idempotent consumer's dedupe table, as in the inventory database: a
-- row is inserted first in the transaction that applies the message.
create table mensagem_processada (
    consumidor    text not null,
    mensagem_id   uuid not null,
    processada_em timestamptz not null default now(),
    primary key (consumidor, mensagem_id)
);

create index mensagem_processada_processada_em_idx on mensagem_processada (processada_em);
