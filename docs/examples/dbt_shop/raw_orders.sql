-- The example's source table, in the warehouse the portal publishes to (PostgreSQL):
-- 1,200 orders, one every 17 minutes from 2022-10-01 00:17 UTC (about two weeks).
--   psql "$WAREHOUSE_URL" -f docs/examples/dbt_shop/raw_orders.sql
DROP TABLE IF EXISTS raw_orders;
CREATE TABLE raw_orders (
    order_id integer PRIMARY KEY,
    customer_id integer NOT NULL,
    ordered_at timestamp NOT NULL,
    status text NOT NULL,
    amount numeric(12, 2) NOT NULL
);
INSERT INTO raw_orders (order_id, customer_id, ordered_at, status, amount)
SELECT n,
       1 + n % 37,
       TIMESTAMP '2022-10-01 00:00:00' + n * INTERVAL '17 minutes',
       (ARRAY['placed', 'shipped', 'returned', 'cancelled'])[1 + n % 4],
       round(5 + ((n * 7919) % 9500) / 100.0, 2)
FROM generate_series(1, 1200) AS n;
