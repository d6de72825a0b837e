//! Configuration: pgbouncer.ini-compatible INI, userlist.
