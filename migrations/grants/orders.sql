-- Grants on the orders database's own tables (migrations/orders), after
-- migrations/grants/common.sql; applied by `order-service migrate`.

-- Placing an order (its items and first status), reading it back, moving
-- its status when the inventory's outcome arrives.
grant select, insert, update (status, status_reason) on orders to entrega_order_service;
grant select, insert on order_items, order_status_history to entrega_order_service;
-- Idempotency-Key: the first request's record, its response, the purge.
grant select, insert, delete, update (response_status, response_body)
    on idempotency_keys to entrega_order_service;
-- With ORDER_OUTBOX_DELETE_IN_TRANSACTION (a CDC relay or Debezium only),
-- the service also deletes the row it just wrote; grant it then:
--   grant select (id), delete on outbox to entrega_order_service;

-- The console's journeys and dead-letter verdicts.
grant select on orders, order_status_history to entrega_console;
