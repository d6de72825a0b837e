"""psycopg 3 against a pooler: every query a named prepared statement (prepare_threshold=0),
pipelines with errors in them, DEALLOCATE ALL / DISCARD ALL, and more distinct statements
than the pooler keeps per server.

Usage: psycopg_driver.py prepared|pipeline|reset|many
"""

import sys
import threading
import traceback

import psycopg
from psycopg import errors
from psycopg.types.json import Jsonb

from common import (CLIENTS, DB, HOST, INSERT_COLUMNS, PASSWORD, PORT, ROUNDS, USER, check,
                    fail, ident, row)

INSERT = f"INSERT INTO items ({INSERT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
SELECT = f"SELECT {INSERT_COLUMNS} FROM items WHERE id >= %s AND id < %s ORDER BY id"


def connect():
    return psycopg.connect(host=HOST, port=PORT, user=USER, password=PASSWORD, dbname=DB,
                           autocommit=True, prepare_threshold=0)


def as_params(values):
    *head, doc = values
    return (*head, Jsonb(doc))


def one_round(conn, client, round_no):
    """One committed transaction of inserts checked by a select, one rolled back, and
    autocommit statements with parameters of several types."""
    ids = [ident(client, round_no, i) for i in range(3)]
    with conn.transaction():
        for i in ids:
            conn.execute(INSERT, as_params(row(i)))
        got = conn.execute(SELECT, (ids[0], ids[-1] + 1)).fetchall()
        check(got == [row(i) for i in ids], f"rows read back: {got}")
    doomed = ident(client, round_no, 5)
    with conn.transaction():
        conn.execute(INSERT, as_params(row(doomed)))
        raise psycopg.Rollback()
    count = conn.execute("SELECT count(*) FROM items WHERE id = %s", (doomed,)).fetchone()[0]
    check(count == 0, "a rolled-back row is visible")
    total, text = conn.execute("SELECT %s::int + %s::int, %s::text || %s::text",
                               (round_no, client, "a", "b")).fetchone()
    check((total, text) == (round_no + client, "ab"), f"arithmetic: {total} {text}")
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def prepared_client(client, servers):
    with connect() as conn:
        for round_no in range(ROUNDS):
            servers.add(one_round(conn, client, round_no))
        named = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        check(named > 0, "no named statement on the server")


def failing_batch(p, error, statements):
    """Runs `statements` in pipeline `p` and ends the batch with a Sync; one of them fails
    with `error`. psycopg raises a result's error as soon as it has read it, which can be at a
    later statement of the batch or at the Sync, depending on how fast the answer came; the
    statements the server then skipped are reported as aborted."""
    raised = False
    for run in statements + [p.sync]:
        try:
            run()
        except error:
            raised = True
        except errors.PipelineAborted:
            pass
    check(raised, f"{error.__name__} was not reported")


def pipeline_client(client, servers):
    with connect() as conn:
        base = ident(client, 0, 0)
        with conn.pipeline() as p:
            cur = conn.cursor()
            for i in range(3):
                cur.execute(INSERT, as_params(row(base + i)))
            p.sync()
            cur.execute(SELECT, (base, base + 3))
            got = cur.fetchall()
            check(got == [row(base + i) for i in range(3)], f"pipelined rows: {got}")
            # An error in the middle of the second of three batches: the first commits,
            # the second rolls back whole, the third runs.
            cur.execute(INSERT, as_params(row(base + 3)))
            p.sync()
            failing_batch(p, errors.DivisionByZero, [
                lambda: cur.execute(INSERT, as_params(row(base + 4))),
                lambda: cur.execute("SELECT 1 / %s", (0,)),
                lambda: cur.execute(INSERT, as_params(row(base + 5))),
            ])
            cur.execute(INSERT, as_params(row(base + 6)))
            p.sync()
            # A statement that cannot be parsed, in the middle of a pipeline.
            failing_batch(p, errors.SyntaxError, [
                lambda: cur.execute(INSERT, as_params(row(base + 7))),
                lambda: cur.execute("SELEC %s", (1,)),
            ])
            cur.execute("SELECT %s::int * 2", (21,))
            check(cur.fetchone() == (42,), "a statement after the failed Parse")
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM items WHERE id >= %s AND id < %s ORDER BY id", (base, base + 10))]
        check(ids == [base, base + 1, base + 2, base + 3, base + 6], f"committed ids: {ids}")
        servers.add(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        for round_no in range(1, ROUNDS):
            with conn.pipeline():
                servers.add(one_round(conn, client, round_no))


def reset_client(client, servers):
    """DEALLOCATE ALL and DISCARD ALL in the middle of prepared traffic: psycopg forgets its
    statements and prepares them again, and every answer stays right."""
    with connect() as conn:
        for round_no in range(ROUNDS):
            servers.add(one_round(conn, client, round_no))
            conn.execute("DEALLOCATE ALL" if round_no % 2 == 0 else "DISCARD ALL")
            check(not conn._prepared._names, "psycopg kept prepared names after a reset")


def many_client(client, servers):
    """More distinct statements than max_prepared_statements, in turn, from every client."""
    queries = [
        ("SELECT %s::int + 1", lambda v: v + 1),
        ("SELECT %s::int * 2", lambda v: v * 2),
        ("SELECT %s::int - 3", lambda v: v - 3),
        ("SELECT %s::bigint * %s::bigint", None),
        ("SELECT length(%s::text)", None),
    ]
    with connect() as conn:
        for n in range(ROUNDS * 5):
            sql, expect = queries[(n + client) % len(queries)]
            if "bigint" in sql:
                got = conn.execute(sql, (n, client)).fetchone()[0]
                check(got == n * client, f"{sql}: {got}")
            elif "length" in sql:
                got = conn.execute(sql, ("x" * n,)).fetchone()[0]
                check(got == n, f"{sql}: {got}")
            else:
                got = conn.execute(sql, (n,)).fetchone()[0]
                check(got == expect(n), f"{sql}: {got}")
            if n % 7 == 0:
                servers.add(one_round(conn, client, n // 7))


def main():
    mode = sys.argv[1]
    target = {"prepared": prepared_client, "pipeline": pipeline_client,
              "reset": reset_client, "many": many_client}[mode]
    servers = [set() for _ in range(CLIENTS)]
    failures = []

    def run(client):
        try:
            target(client, servers[client])
        except BaseException as err:  # noqa: BLE001 - reported below
            failures.append(err)
            traceback.print_exc()

    threads = [threading.Thread(target=run, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        fail(failures[0])
    moved = max(len(s) for s in servers)
    print(f"psycopg {mode}: {CLIENTS} clients, most servers seen by one client: {moved}")


if __name__ == "__main__":
    main()
