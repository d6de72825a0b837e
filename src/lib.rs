//! pgward: a PostgreSQL connection pooler that reads pgbouncer.ini, whose pool checkout is an
//! admission gate.

pub mod admin;
pub mod cancel;
pub mod check;
pub mod client;
pub mod config;
pub mod connection;
pub mod cost;
pub mod daemon;
pub mod edge;
pub mod gate;
pub mod listener;
pub mod metrics;
pub mod net;
pub mod ops;
pub mod params;
pub mod policy;
pub mod pool;
pub mod runtime;
pub mod server;
pub mod session;
pub mod sql;
pub mod sync;
pub mod wire;
