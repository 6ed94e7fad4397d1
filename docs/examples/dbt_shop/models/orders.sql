-- One row per order that was not cancelled. A microbatch model: no filter on time here,
-- dbt (and the portal) give it one interval of its source at a time.
select
    order_id,
    customer_id,
    ordered_at,
    status,
    {{ cents_to_amount('amount_cents') }} as amount
from (
    select order_id, customer_id, ordered_at, status, round(amount * 100) as amount_cents
    from {{ source('shop', 'raw_orders') }}
) as raw
where status <> 'cancelled'
