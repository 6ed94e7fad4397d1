-- One row per day: the number of orders and their amount.
select
    cast(date_trunc('day', ordered_at) as date) as sales_date,
    count(*) as order_count,
    sum(amount) as amount
from {{ ref('orders') }}
group by 1
