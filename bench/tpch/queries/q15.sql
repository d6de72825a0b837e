-- TPC-H Q15, top supplier, with the revenue view as a CTE. date: the first day of a month,
-- 1993-01 to 1997-10.
with revenue (supplier_no, total_revenue) as (
    select
        l_suppkey,
        sum(l_extendedprice * (1 - l_discount))
    from lineitem
    where l_shipdate >= date :'date'
        and l_shipdate < date :'date' + interval '3' month
    group by l_suppkey
)
select
    s_suppkey,
    s_name,
    s_address,
    s_phone,
    total_revenue
from supplier, revenue
where s_suppkey = supplier_no
    and total_revenue = (select max(total_revenue) from revenue)
order by s_suppkey;
