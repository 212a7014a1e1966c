-- Grants on the inventory database's own tables (migrations/inventory),
-- after migrations/grants/common.sql; applied by `inventory-service migrate`.

-- Reserving and releasing stock (rows locked with for update), and the
-- admin API's PUT /stock/{sku} (an upsert).
grant select, insert (sku, available), update (available, reserved, updated_at)
    on stock to entrega_inventory_service;
grant select, insert, update (status, cancelled_at, cancel_message_id)
    on reservations to entrega_inventory_service;
grant select, insert on reservation_items to entrega_inventory_service;

-- The console's journeys and dead-letter verdicts.
grant select on reservations, reservation_items to entrega_console;
