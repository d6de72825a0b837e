// node-postgres against a pooler, with named statements ({name, text, values}): the driver
// sends Parse once per connection and name, then only Bind and Execute, whichever server the
// pooler gives the next transaction.
//
// The connection comes from PGWARD_HOST, PGWARD_PORT, PGWARD_USER, PGWARD_PASSWORD, PGWARD_DB;
// PGWARD_CLIENTS clients run at once, PGWARD_ROUNDS rounds each.
'use strict';

const assert = require('assert');
const { Client } = require('pg');

const env = process.env;
const CLIENTS = Number(env.PGWARD_CLIENTS || 5);
const ROUNDS = Number(env.PGWARD_ROUNDS || 8);
const COLUMNS = 'id, name, price, created, data, flag, score, tags, doc';

function connect() {
  const client = new Client({
    host: env.PGWARD_HOST || '127.0.0.1',
    port: Number(env.PGWARD_PORT),
    user: env.PGWARD_USER,
    password: env.PGWARD_PASSWORD,
    database: env.PGWARD_DB || 'app',
  });
  return client.connect().then(() => client);
}

function ident(client, round, i) {
  return client * 10000 + round * 10 + i;
}

// The row written for `id`, as node-postgres reads it back (numeric as a string).
function row(id) {
  return {
    id,
    name: `name ${id} é`,
    price: `${id}.25`,
    created: new Date(Date.UTC(2024, 0, 1 + (id % 28), 12, id % 60)),
    data: Buffer.from([id % 256, 0, 255, 10]),
    flag: id % 2 === 0,
    score: id / 4,
    tags: [`t${id}`, null, 'x'],
    doc: { id, nested: [1, 'two'] },
  };
}

function insert(conn, id) {
  const r = row(id);
  return conn.query({
    name: 'insert-item',
    text: `INSERT INTO items (${COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
    values: [r.id, r.name, r.price, r.created, r.data, r.flag, r.score, r.tags, r.doc],
  });
}

async function oneRound(conn, client, round) {
  const ids = [0, 1, 2].map((i) => ident(client, round, i));
  await conn.query('BEGIN');
  for (const id of ids) await insert(conn, id);
  const got = await conn.query({
    name: 'select-items',
    text: `SELECT ${COLUMNS} FROM items WHERE id >= $1 AND id < $2 ORDER BY id`,
    values: [ids[0], ids[2] + 1],
  });
  assert.deepStrictEqual(got.rows, ids.map(row));
  await conn.query('COMMIT');
  const doomed = ident(client, round, 5);
  await conn.query('BEGIN');
  await insert(conn, doomed);
  await conn.query('ROLLBACK');
  const count = await conn.query({
    name: 'count-item',
    text: 'SELECT count(*)::int AS n FROM items WHERE id = $1',
    values: [doomed],
  });
  assert.strictEqual(count.rows[0].n, 0, 'a rolled-back row is visible');
  const sum = await conn.query({
    name: 'sum',
    text: 'SELECT $1::int + $2::int AS total, $3::text || $4::text AS text',
    values: [round, client, 'a', 'b'],
  });
  assert.deepStrictEqual(sum.rows[0], { total: round + client, text: 'ab' });
  const pid = await conn.query({ name: 'pid', text: 'SELECT pg_backend_pid() AS pid' });
  return pid.rows[0].pid;
}

async function clientLoop(client) {
  const conn = await connect();
  const servers = new Set();
  try {
    for (let round = 0; round < ROUNDS; round++) {
      servers.add(await oneRound(conn, client, round));
    }
  } finally {
    await conn.end();
  }
  return servers.size;
}

// Runs a named statement, then runs it again while another client's transaction holds the
// server it ran on; returns how many servers it ran on.
async function movedStatement() {
  const conn = await connect();
  const holder = await connect();
  const pinned = (v) =>
    conn.query({ name: 'pinned', text: 'SELECT $1::int * 2 AS v, pg_backend_pid() AS pid', values: [v] });
  try {
    for (let attempt = 0; attempt < 30; attempt++) {
      const first = (await pinned(attempt)).rows[0];
      assert.strictEqual(first.v, attempt * 2);
      await holder.query('BEGIN');
      const held = (await holder.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
      if (held === first.pid) {
        const second = (await pinned(attempt + 1)).rows[0];
        await holder.query('ROLLBACK');
        assert.strictEqual(second.v, (attempt + 1) * 2);
        assert.notStrictEqual(second.pid, first.pid, 'ran on the held server');
        return 2;
      }
      await holder.query('ROLLBACK');
    }
    return 1;
  } finally {
    await conn.end();
    await holder.end();
  }
}

async function main() {
  const moved = await movedStatement();
  const clients = [];
  for (let c = 0; c < CLIENTS; c++) clients.push(clientLoop(c));
  const seen = await Promise.all(clients);
  const most = Math.max(moved, ...seen);
  console.log(`node-postgres: ${CLIENTS} clients, most servers seen by one client: ${most}`);
}

main().catch((err) => {
  console.error('FAILED:', err);
  process.exit(1);
});
