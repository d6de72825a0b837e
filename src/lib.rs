//! pgward: a PostgreSQL connection pooler that reads pgbouncer.ini, whose pool checkout is an
//! admission gate.

pub mod config;
pub mod wire;
