-- The relay counts parked rows every few seconds for its metrics. Without an
-- index that count read the whole table: with ten million retained rows, a
-- half-second parallel scan on every sample (found by the P5 benchmark).
create index outbox_parked_idx on outbox (parked_at) where parked_at is not null;
