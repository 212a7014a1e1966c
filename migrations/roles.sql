-- The roles entrega's grants name: one group role (NOLOGIN) per part, made
-- once per PostgreSQL cluster by an administrator (a role that may create
-- roles), before the first `order-service migrate` / `inventory-service
-- migrate`, which grant to them (migrations/grants/). Log-in roles are the
-- deployer's: give each part a login of its own, member of its group
-- (`create role orders_app login password '…' in role entrega_order_service`),
-- so that every grant is in one reviewed file. Safe to run again, and by two
-- sessions at once. docs/security.md, "Least privilege", says which login
-- needs what beyond these (REPLICATION for a CDC relay).
do $$
declare
    name text;
begin
    foreach name in array array[
        'entrega_order_service',     -- the order service, in the orders database
        'entrega_inventory_service', -- the inventory service, in the inventory database
        'entrega_relay',             -- outbox-relay, in both
        'entrega_console',           -- the console's inspection: reads only
        'entrega_redrive',           -- the redrive audit: one insert
        'entrega_debezium'           -- Debezium's connector, in place of the relay: reads the outbox
    ] loop
        begin
            if not exists (select from pg_roles where rolname = name) then
                execute format('create role %I nologin', name);
            end if;
        exception when duplicate_object or unique_violation then
            null; -- made by another session in between
        end;
    end loop;
end
$$;
