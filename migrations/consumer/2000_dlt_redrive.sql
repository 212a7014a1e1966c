-- Who redrove which dead letter, when, and where it went: written by the
-- DLT tools (`<service> dlt redrive`, `entrega dlt redrive`, the console's
-- page) once the broker acknowledged the copy, before the redrive group's
-- offset moves past it. Read by `entrega journey`.
create table if not exists dlt_redrive (
    position      bigint generated always as identity primary key,
    dlt_topic     text not null,
    dlt_partition integer not null,
    dlt_offset    bigint not null,
    -- The record's `id` header, when it holds a UUID.
    message_id    uuid,
    reason        text,
    to_topic      text not null,
    to_partition  integer not null,
    to_offset     bigint not null,
    operator      text not null check (char_length(operator) between 1 and 200),
    -- 'cli' or 'console'.
    via           text not null,
    redriven_at   timestamptz not null default now()
);

create index if not exists dlt_redrive_message_id_idx on dlt_redrive (message_id);
