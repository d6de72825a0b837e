"""asyncpg against a pooler, with its statement cache on (the default): every query is a named
prepared statement that asyncpg prepares once per connection and reuses, whichever server
the pooler gives the next transaction.
"""

import asyncio
import json

import asyncpg

from common import (CLIENTS, DB, HOST, INSERT_COLUMNS, PASSWORD, PORT, ROUNDS, USER, check,
                    fail, ident, row)

INSERT = f"INSERT INTO items ({INSERT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
SELECT = f"SELECT {INSERT_COLUMNS} FROM items WHERE id >= $1 AND id < $2 ORDER BY id"
PINNED = "SELECT $1::int * 2, pg_backend_pid()"


async def connect():
    conn = await asyncpg.connect(host=HOST, port=PORT, user=USER, password=PASSWORD,
                                 database=DB)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                              schema="pg_catalog")
    return conn


def as_record(values):
    return tuple(values)


async def one_round(conn, client, round_no):
    ids = [ident(client, round_no, i) for i in range(3)]
    async with conn.transaction():
        for i in ids:
            await conn.execute(INSERT, *row(i))
        got = [tuple(r) for r in await conn.fetch(SELECT, ids[0], ids[-1] + 1)]
        check(got == [row(i) for i in ids], f"rows read back: {got}")
    doomed = ident(client, round_no, 5)
    tr = conn.transaction()
    await tr.start()
    await conn.execute(INSERT, *row(doomed))
    await tr.rollback()
    count = await conn.fetchval("SELECT count(*) FROM items WHERE id = $1", doomed)
    check(count == 0, "a rolled-back row is visible")
    total, text = await conn.fetchrow("SELECT $1::int + $2::int, $3::text || $4::text",
                                      round_no, client, "a", "b")
    check((total, text) == (round_no + client, "ab"), f"arithmetic: {total} {text}")
    return await conn.fetchval("SELECT pg_backend_pid()")


async def client_loop(client, servers):
    conn = await connect()
    try:
        for round_no in range(ROUNDS):
            servers.add(await one_round(conn, client, round_no))
        cached = len(conn._stmt_cache)
        check(cached > 0, "asyncpg cached no statement")
    finally:
        await conn.close()


async def moved_statement():
    """Runs a cached statement, then runs it again while another client's transaction holds
    the server it ran on: the second run must be on another server, and still right."""
    conn, holder = await connect(), await connect()
    try:
        for attempt in range(30):
            value, first = await conn.fetchrow(PINNED, attempt)
            check(value == attempt * 2, "first run")
            tr = holder.transaction()
            await tr.start()
            held = await holder.fetchval("SELECT pg_backend_pid()")
            if held == first:
                value, second = await conn.fetchrow(PINNED, attempt + 1)
                await tr.rollback()
                check(value == (attempt + 1) * 2, "the run on another server")
                check(second != first, "the cached statement ran on the held server")
                return 2
            await tr.rollback()
        return 1
    finally:
        await conn.close()
        await holder.close()


async def main():
    moved = await moved_statement()
    servers = [set() for _ in range(CLIENTS)]
    results = await asyncio.gather(*(client_loop(c, servers[c]) for c in range(CLIENTS)),
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        fail(errors[0])
    most = max(max(len(s) for s in servers), moved)
    print(f"asyncpg: {CLIENTS} clients, most servers seen by one client: {most}")


if __name__ == "__main__":
    asyncio.run(main())
