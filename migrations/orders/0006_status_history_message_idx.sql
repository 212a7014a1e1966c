-- `entrega journey <message id>` finds the order of an outcome event by the
-- status change it caused, once the delivery log no longer knows the id.
create index order_status_history_message_id_idx on order_status_history (message_id)
    where message_id is not null;
