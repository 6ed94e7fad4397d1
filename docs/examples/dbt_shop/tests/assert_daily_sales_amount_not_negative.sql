-- A singular test: a day's sales are never negative (returns are not refunds here).
select sales_date, amount
from {{ ref('daily_sales') }}
where amount < 0
