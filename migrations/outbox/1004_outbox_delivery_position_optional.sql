-- A row published to RabbitMQ has no position: a confirm says the broker
-- took the message, not where a queue holds it (a queue has no offsets).
-- Such a delivery is logged with its exchange (in `topic`) and no
-- partition or offset; a Kafka delivery still has both.
alter table outbox_delivery alter column partition drop not null;
alter table outbox_delivery alter column "offset" drop not null;
