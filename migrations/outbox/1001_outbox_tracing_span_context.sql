-- The trace context of the work that wrote the row, in the form Debezium's
-- Outbox Event Router reads when OpenTelemetry is on the Connect worker
-- (`tracing.span.context.field`, default `tracingspancontext`): Java
-- Properties text, one `key=value` per line, `traceparent` and, when there
-- is one, `tracestate`:
--
--     traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
--     tracestate=congo=t61rcWkgMzE
--
-- The built-in relay reads it too and continues the trace from it. The
-- `traceparent` column stays, written alongside: it is what Debezium without
-- OpenTelemetry copies to the header (`table.fields.additional.placement`),
-- and what rows written before this column carry.
--
-- Both the orders and the inventory databases get it (this set runs after
-- each service's own).
--
-- The check is added NOT VALID: the column is new, so every existing row
-- holds NULL and there is nothing to check, and a validating scan would hold
-- the table's lock over every retained row. New rows are checked all the
-- same.

alter table outbox add column if not exists tracingspancontext text;
alter table outbox add constraint outbox_tracingspancontext_size
    check (octet_length(tracingspancontext) <= 2048) not valid;
