-- A reservation's created_at is the moment its outcome was decided, not the
-- start of its transaction: one transaction may decide a batch of orders,
-- and latency is measured from the outbox row to this moment.
alter table reservations alter column created_at set default clock_timestamp();
