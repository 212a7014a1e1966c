-- The idempotent consumer's dedupe table, owned by this library
-- (idempotent_consumer::processed): a row is inserted first in the
-- transaction that applies the message's effect; the primary key decides
-- which delivery of a message wins, and a duplicate inserts nothing and
-- changes nothing.
--
-- The inventory (0001) and orders (0005) sets made the same table before
-- this set owned it; on their databases both statements change nothing,
-- and the rows already there keep deciding.
create table if not exists mensagem_processada (
    consumidor    text not null,
    mensagem_id   uuid not null,
    processada_em timestamptz not null default now(),
    primary key (consumidor, mensagem_id)
);

-- Retention deletes by age, a batch at a time.
create index if not exists mensagem_processada_processada_em_idx on mensagem_processada (processada_em);
