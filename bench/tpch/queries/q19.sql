-- TPC-H Q19, discounted revenue. brand1 to brand3: Brand#MN (M, N 1 to 5); quantity1: 1 to
-- 10, quantity2: 10 to 20, quantity3: 20 to 30. ('AIR REG' is as the specification has it.)
select
    sum(l_extendedprice * (1 - l_discount)) as revenue
from lineitem, part
where (
        p_partkey = l_partkey
        and p_brand = :'brand1'
        and p_container in ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
        and l_quantity >= :quantity1 and l_quantity <= :quantity1 + 10
        and p_size between 1 and 5
        and l_shipmode in ('AIR', 'AIR REG')
        and l_shipinstruct = 'DELIVER IN PERSON'
    )
    or (
        p_partkey = l_partkey
        and p_brand = :'brand2'
        and p_container in ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK')
        and l_quantity >= :quantity2 and l_quantity <= :quantity2 + 10
        and p_size between 1 and 10
        and l_shipmode in ('AIR', 'AIR REG')
        and l_shipinstruct = 'DELIVER IN PERSON'
    )
    or (
        p_partkey = l_partkey
        and p_brand = :'brand3'
        and p_container in ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
        and l_quantity >= :quantity3 and l_quantity <= :quantity3 + 10
        and p_size between 1 and 15
        and l_shipmode in ('AIR', 'AIR REG')
        and l_shipinstruct = 'DELIVER IN PERSON'
    );
