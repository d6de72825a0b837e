-- TPC-H Q17, small-quantity-order revenue. brand: Brand#MN (M, N 1 to 5); container: a size
-- (SM, LG, MED, JUMBO, WRAP) and a kind (CASE, BOX, BAG, JAR, PKG, PACK, CAN, DRUM).
select
    sum(l_extendedprice) / 7.0 as avg_yearly
from lineitem, part
where p_partkey = l_partkey
    and p_brand = :'brand'
    and p_container = :'container'
    and l_quantity < (
        select 0.2 * avg(l_quantity)
        from lineitem
        where l_partkey = p_partkey
    );
