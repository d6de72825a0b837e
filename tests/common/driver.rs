//! tokio-postgres connections for tests that need the extended protocol, cancel tokens or
//! SQLSTATEs of a driver.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::{Client, Error, NoTls};

/// A connected client and the task driving its connection; the task's result is the error
/// that ended the connection, if any (an unsolicited FATAL shows up there).
pub struct Conn {
    pub client: Client,
    pub task: JoinHandle<Result<(), Error>>,
}

/// Connects with a libpq-style connection string.
pub async fn connect(connstr: &str) -> Result<Conn, Error> {
    let (client, connection) = tokio_postgres::connect(connstr, NoTls).await?;
    let task = tokio::spawn(connection);
    Ok(Conn { client, task })
}

/// Connects, panicking with the error on failure.
pub async fn must_connect(connstr: &str) -> Conn {
    connect(connstr)
        .await
        .unwrap_or_else(|err| panic!("cannot connect with {connstr:?}: {err:?}"))
}

/// The SQLSTATE of an error, or `"<none>"` with the error text when it carries none.
pub fn code(err: &Error) -> String {
    match err.code() {
        Some(state) => state.code().to_string(),
        None => format!("<none: {err}>"),
    }
}

/// The message of a server (or pooler) error, or the error's text.
/// The SQLSTATE a simple query answers (empty when it succeeds).
pub async fn outcome(c: &Client, sql: &str) -> String {
    match c.simple_query(sql).await {
        Ok(_) => String::new(),
        Err(e) => code(&e),
    }
}

pub fn message(err: &Error) -> String {
    match err.as_db_error() {
        Some(db) => db.message().to_string(),
        None => err.to_string(),
    }
}

/// Runs `sql` and returns the first column of the first row as text.
pub async fn value(client: &Client, sql: &str) -> Result<String, Error> {
    let rows = client.simple_query(sql).await?;
    for msg in rows {
        if let tokio_postgres::SimpleQueryMessage::Row(row) = msg {
            return Ok(row.get(0).unwrap_or_default().to_string());
        }
    }
    Ok(String::new())
}

/// Runs `sql`, panicking with the error on failure.
pub async fn must_value(client: &Client, sql: &str) -> String {
    value(client, sql)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err:?}"))
}

/// Runs `SELECT pg_sleep(10)` on `conn`, cancels it with the driver's cancel token (a cancel
/// request on a connection of its own) 300 ms later, checks that it ended in 57014 within 3 s
/// and returns the client.
pub async fn cancel_a_sleep(conn: Conn) -> Client {
    let token = conn.client.cancel_token();
    let client = conn.client;
    let sleeper = tokio::spawn(async move {
        let result = client.simple_query("SELECT pg_sleep(10)").await;
        (client, result)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    token.cancel_query(NoTls).await.expect("cancel request");
    let (client, result) = tokio::time::timeout(Duration::from_secs(3), sleeper)
        .await
        .expect("the statement was not cancelled")
        .expect("task");
    let err = result.expect_err("pg_sleep finished");
    assert_eq!(code(&err), "57014", "{err:?}");
    client
}

/// The result of the connection task once it ends within `wait`: `Some(code)` of the error
/// that ended it (an empty string for a clean end), `None` if it is still running.
pub async fn end_of(conn: Conn, wait: Duration) -> Option<String> {
    match tokio::time::timeout(wait, conn.task).await {
        Ok(Ok(Ok(()))) => Some(String::new()),
        Ok(Ok(Err(err))) => Some(code(&err)),
        Ok(Err(join)) => panic!("connection task failed: {join}"),
        Err(_) => None,
    }
}

/// The rows of a console SHOW, each as column name -> value (NULL as `None`).
pub async fn show(c: &Client, sql: &str) -> Vec<std::collections::HashMap<String, Option<String>>> {
    use tokio_postgres::SimpleQueryMessage;
    let mut cols: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    for m in c
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    {
        match m {
            SimpleQueryMessage::RowDescription(d) => {
                cols = d.iter().map(|c| c.name().to_string()).collect()
            }
            SimpleQueryMessage::Row(r) => rows.push(
                cols.iter()
                    .enumerate()
                    .map(|(i, name)| (name.clone(), r.get(i).map(str::to_string)))
                    .collect(),
            ),
            _ => {}
        }
    }
    rows
}

/// The columns of a console SHOW, in order.
pub async fn columns(c: &Client, sql: &str) -> Vec<String> {
    for m in c.simple_query(sql).await.expect(sql) {
        if let tokio_postgres::SimpleQueryMessage::RowDescription(d) = m {
            return d.iter().map(|c| c.name().to_string()).collect();
        }
    }
    panic!("{sql}: no row description");
}
