-- TPC-H Q14, promotion effect. date: the first day of a month, 1993 to 1997.
select
    100.00 * sum(case
        when p_type like 'PROMO%' then l_extendedprice * (1 - l_discount)
        else 0
    end) / sum(l_extendedprice * (1 - l_discount)) as promo_revenue
from lineitem, part
where l_partkey = p_partkey
    and l_shipdate >= date :'date'
    and l_shipdate < date :'date' + interval '1' month;
