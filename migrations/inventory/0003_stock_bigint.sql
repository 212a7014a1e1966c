-- Stock counts as bigint. `reserved` only grows: as `integer` it overflowed
-- past 2^31 units of one sku, and from then on every order for that sku
-- failed its transaction. The checks (never negative) stay as they were.
alter table stock
    alter column available type bigint,
    alter column reserved type bigint;
