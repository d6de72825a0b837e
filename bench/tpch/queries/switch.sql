-- Not TPC-H: a statement whose plan follows its parameters. The line items of a range of part
-- keys: a few keys are read through the index on l_partkey (an index scan, then a bitmap scan
-- as the range widens), a wide range by reading lineitem in full. lo: the first key; hi: the
-- last.
select
    count(*) as lines,
    sum(l_extendedprice * (1 - l_discount)) as revenue
from lineitem
where l_partkey between :lo and :hi;
