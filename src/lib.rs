//! pgward: a PostgreSQL connection pooler that reads pgbouncer.ini, whose pool checkout is an
//! admission gate.
//!
//! The modules are listed in the order a request travels; the support modules follow.

// The path of a request.
// The process: start-up, maintenance, signals, shutdown.
pub mod daemon;
// Listening sockets; one task per accepted connection.
pub mod listener;
// One accepted connection: counted, logged in, routed to the console or a pool, greeted.
pub mod connection;
// A client's login: startup packet, TLS, authentication.
pub mod client;
// The relay of a logged-in client: messages, prepared statements, rules, the gate's call.
pub mod session;
// The admission gate: tenants, budgets, lanes, fair queue (pure), and its keeper.
pub mod gate;
// Pools of servers: checkout, check-in, growth, lifetimes, maintenance.
pub mod pool;
// One backend connection: login, the expected-answer queue, pgward's own statements.
pub mod server;

// What the path uses.
// The admin console database.
pub mod admin;
// Cancel requests: pgward's keys, forwarded to the server a client uses.
pub mod cancel;
// `pgward check`: a policy tried on a corpus of statements.
pub mod check;
// pgbouncer.ini, the auth file, and their defaults.
pub mod config;
// EXPLAIN plans, their price and the cost ceilings, the plan cache.
pub mod cost;
// Budgets and slots shared by several pgward instances: leases of one capacity.
pub mod fleet;
// TLS, hba rules, the failed-login throttle, client caps.
pub mod edge;
// The Prometheus endpoint.
pub mod metrics;
// Shared names compared by address first.
pub mod name;
// Byte streams: TCP, Unix, TLS on either side.
pub mod net;
// The operations state: client registry, counters, pause and shutdown, console overrides.
pub mod ops;
// Session parameters that follow a client from server to server.
pub mod params;
// The governance policy file and the policy in force.
pub mod policy;
// The running pooler's shared state, passed to every task.
pub mod runtime;
pub mod simulate;
// PostgreSQL's parser on a statement text: fingerprints, kinds, tags.
pub mod sql;
// The poison-tolerant lock helper.
pub mod sync;
// The reading of each PostgreSQL server and the lock-queue guard.
pub mod watch;
// The sans-IO protocol codec.
pub mod wire;
// The worker threads, each with its own runtime, and which one serves each client.
pub mod workers;
