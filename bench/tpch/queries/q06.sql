-- TPC-H Q6, forecasting revenue change. date: January 1st, 1993 to 1997; discount: 0.02 to
-- 0.09; quantity: 24 or 25.
select
    sum(l_extendedprice * l_discount) as revenue
from lineitem
where l_shipdate >= date :'date'
    and l_shipdate < date :'date' + interval '1' year
    and l_discount between :discount - 0.01 and :discount + 0.01
    and l_quantity < :quantity;
