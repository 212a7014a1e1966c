-- Cancellation (PedidoCancelado on pedido.eventos, after its PedidoCriado):
--   RESERVED  -> RELEASED: the items go back to stock, once;
--   no outcome yet -> CANCELLED: the creation was not applied (dead-lettered
--   and not redriven); a later redrive of it finds the order decided and
--   reserves nothing.
alter table reservations drop constraint reservations_status_check;
alter table reservations
    add constraint reservations_status_check
        check (status in ('RESERVED', 'REJECTED', 'RELEASED', 'CANCELLED')),
    -- When and by which message the reservation was released or the order
    -- cancelled before it was decided.
    add column cancelled_at timestamptz,
    add column cancel_message_id uuid,
    add check ((status in ('RELEASED', 'CANCELLED')) = (cancel_message_id is not null));
