//! The same raw message sequences sent to PostgreSQL directly and through pgward (transaction
//! pooling) must get the same answers, byte for byte.
//!
//! Each sequence runs on a fresh connection to each side; the login exchange is not compared
//! (pgward owns the BackendKeyData and the ParameterStatus values it reports at login). After
//! login every message must be identical, with two exceptions:
//!
//! - a ParameterStatus is compared by name only, since its value is the server's or pgward's;
//! - an ErrorResponse that quotes a prepared statement's name is compared by SQLSTATE only.
//!   pgward prepares a client's named statements on the server under its own names
//!   (`pgw_` and a hash of the statement), so when the server itself reports on such a
//!   statement (a second Parse of a name already in use, a Bind with the wrong number of
//!   parameters), it quotes pgward's name where PostgreSQL would quote the client's. Errors
//!   about names pgward does not map (a Bind of a statement that does not exist) are still
//!   compared byte for byte.
//!
//! pgward runs with `default_pool_size = 1`, so every sequence reuses the one server and its
//! leftovers (pgward's own prepared statements, the unnamed statement) would show.

mod common;

use common::raw::{self, Batch, Message, Raw};
use common::{Pgward, Postgres};

/// The role both sides log in as (trusted by PostgreSQL and, with `auth_type = trust`, by
/// pgward).
const USER: &str = "trustuser";

const SCHEMA: &str = "CREATE TABLE t (a int); \
     CREATE TABLE c (a int PRIMARY KEY, b text); \
     CREATE TABLE d (a int, CONSTRAINT d_a UNIQUE (a) DEFERRABLE INITIALLY DEFERRED); \
     GRANT ALL ON t, c, d TO PUBLIC";

const RESET: &str = "TRUNCATE t, c, d";

/// What one step sends, and how far it reads.
struct Step {
    batch: Batch,
    until: Until,
}

enum Until {
    /// This many ReadyForQuery messages.
    Ready(usize),
    /// The first message with this tag (CopyInResponse, PortalSuspended...).
    Tag(u8),
}

fn ready(batch: Batch, count: usize) -> Step {
    Step {
        batch,
        until: Until::Ready(count),
    }
}

fn until_tag(batch: Batch, tag: u8) -> Step {
    Step {
        batch,
        until: Until::Tag(tag),
    }
}

/// A PostgreSQL server with the test tables, and pgward in front of it.
struct Rig {
    pg: Postgres,
    pgward: Pgward,
}

impl Rig {
    fn start(pool_size: u32) -> Rig {
        Rig::start_with(pool_size, "")
    }

    fn start_with(pool_size: u32, extra: &str) -> Rig {
        let pg = Postgres::start();
        pg.sql(SCHEMA);
        let settings = format!(
            "pool_mode = transaction\ndefault_pool_size = {pool_size}\nauth_type = trust\n{extra}"
        );
        let pgward = Pgward::start(&Pgward::ini(&pg, &settings, ""));
        Rig { pg, pgward }
    }

    /// Runs `steps` on a fresh connection to each side (tables emptied first) and compares
    /// the answers.
    fn compare(&self, name: &str, steps: &[Step]) {
        self.pg.sql(RESET);
        let direct = run(self.pg.port, steps, |_| {});
        self.pg.sql(RESET);
        let pooled = run(self.pgward.port, steps, |_| {});
        assert_same(name, &direct, &pooled, &self.pgward);
    }
}

/// Connects to `port`, runs every step (calling `between(i)` before step `i`), and returns
/// every answer in order.
fn run(port: u16, steps: &[Step], mut between: impl FnMut(usize)) -> Vec<Message> {
    let mut conn = Raw::login(port, USER, None, "app");
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        between(i);
        conn.send(&step.batch);
        out.extend(match step.until {
            Until::Ready(count) => conn.until_ready(count),
            Until::Tag(tag) => conn.until_tag(tag),
        });
    }
    conn.terminate();
    out
}

/// A message as compared: exact bytes, or only what the module documentation allows to
/// differ removed.
#[derive(Debug, PartialEq, Eq)]
enum Compared {
    Exact(Message),
    ParameterStatus(String),
    ErrorCode(String),
}

fn compared(msg: &Message) -> Compared {
    match msg.tag {
        b'S' => Compared::ParameterStatus(
            msg.body
                .split(|b| *b == 0)
                .next()
                .map(|name| String::from_utf8_lossy(name).into_owned())
                .unwrap_or_default(),
        ),
        b'E' if quotes_a_statement(msg) => Compared::ErrorCode(msg.sqlstate().unwrap_or_default()),
        _ => Compared::Exact(msg.clone()),
    }
}

fn quotes_a_statement(msg: &Message) -> bool {
    msg.fields().message().contains("prepared statement \"")
}

fn assert_same(name: &str, direct: &[Message], pooled: &[Message], pgward: &Pgward) {
    // Classify by the direct answer: the pooled one must fit the same class.
    let expected: Vec<Compared> = direct.iter().map(compared).collect();
    let got: Vec<Compared> = pooled
        .iter()
        .zip(direct.iter().chain(std::iter::repeat(&Message {
            tag: 0,
            body: Vec::new(),
        })))
        .map(|(p, d)| match compared(d) {
            Compared::ErrorCode(_) if p.tag == b'E' => {
                Compared::ErrorCode(p.sqlstate().unwrap_or_default())
            }
            _ => compared(p),
        })
        .collect();
    if expected != got {
        let first = expected
            .iter()
            .zip(&got)
            .position(|(a, b)| a != b)
            .unwrap_or(expected.len().min(got.len()));
        panic!(
            "{name}: answers differ from message {first} on\n  direct:  {:?}\n  pgward:  {:?}\n\
             direct tags {} / pgward tags {}\n{}",
            expected.get(first..),
            got.get(first..),
            raw::tags(direct),
            raw::tags(pooled),
            pgward.log()
        );
    }
}

#[test]
fn simple_queries_match() {
    let rig = Rig::start(1);
    rig.compare(
        "one row of several types",
        &[ready(
            Batch::new()
                .query("SELECT 1 AS one, 'x'::text AS two, NULL::int AS three, 1.5::numeric"),
            1,
        )],
    );
    rig.compare(
        "multi-statement query with an error in the middle",
        &[ready(
            Batch::new()
                .query("INSERT INTO t VALUES (1); SELECT 1/0; INSERT INTO t VALUES (2)")
                .query("SELECT count(*) FROM t"),
            2,
        )],
    );
    rig.compare(
        "empty query and a syntax error",
        &[ready(Batch::new().query("").query(";").query("SELEC 1"), 3)],
    );
    rig.compare(
        "explicit transaction over several queries",
        &[
            ready(Batch::new().query("BEGIN; INSERT INTO t VALUES (3)"), 1),
            ready(Batch::new().query("SELECT count(*) FROM t"), 1),
            ready(Batch::new().query("SELECT 1/0"), 1),
            ready(Batch::new().query("SELECT 1"), 1),
            ready(Batch::new().query("ROLLBACK"), 1),
            ready(Batch::new().query("SELECT count(*) FROM t"), 1),
        ],
    );
}

#[test]
fn extended_protocol_with_unnamed_and_named_statements_matches() {
    let rig = Rig::start(1);
    rig.compare(
        "unnamed statement",
        &[ready(
            Batch::new()
                .parse("", "SELECT $1::int + 1 AS n", &[23])
                .bind("", "", &[Some("41")])
                .describe(b'P', "")
                .execute("", 0)
                .sync(),
            1,
        )],
    );
    rig.compare(
        "named statement described, executed, then reused in later batches",
        &[
            ready(
                Batch::new()
                    .parse("s1", "SELECT $1::text || 'y' AS s, $2::int AS i", &[0, 23])
                    .describe(b'S', "s1")
                    .bind("", "s1", &[Some("x"), Some("7")])
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(
                Batch::new()
                    .bind("", "s1", &[Some("z"), None])
                    .execute("", 0)
                    .bind("", "s1", &[None, Some("-3")])
                    .describe(b'P', "")
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(Batch::new().describe(b'S', "s1").sync(), 1),
            ready(
                Batch::new()
                    .bind("", "s1", &[Some("one parameter short")])
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(
                Batch::new()
                    .parse("s1", "SELECT 2", &[])
                    .bind("", "s1", &[Some("again"), Some("1")])
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(
                Batch::new()
                    .bind("", "s1", &[Some("still"), Some("2")])
                    .execute("", 0)
                    .sync(),
                1,
            ),
        ],
    );
    rig.compare(
        "empty query in the extended protocol",
        &[ready(
            Batch::new()
                .parse("", "", &[])
                .bind("", "", &[])
                .describe(b'P', "")
                .execute("", 0)
                .sync(),
            1,
        )],
    );
    rig.compare(
        "a bad statement's Parse fails, then the name is free",
        &[
            ready(
                Batch::new()
                    .parse("bad", "SELEC 1", &[])
                    .bind("", "bad", &[])
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(Batch::new().bind("", "bad", &[]).execute("", 0).sync(), 1),
            ready(
                Batch::new()
                    .parse("bad", "SELECT 2", &[])
                    .bind("", "bad", &[])
                    .execute("", 0)
                    .sync(),
                1,
            ),
        ],
    );
    rig.compare(
        "a statement that does not exist",
        &[ready(
            Batch::new()
                .bind("", "nope", &[])
                .execute("", 0)
                .sync()
                .describe(b'S', "nope")
                .sync(),
            2,
        )],
    );
}

/// The client re-Parses a name in the same pipeline as the Parse that fails for it: by the
/// time PostgreSQL reads the second Parse, the name is free again.
#[test]
fn a_name_whose_parse_failed_is_free_later_in_the_same_pipeline() {
    let rig = Rig::start(1);
    rig.compare(
        "bad Parse, then a good one of the same name, in one pipeline",
        &[ready(
            Batch::new()
                .parse("bad", "SELEC 1", &[])
                .bind("", "bad", &[])
                .execute("", 0)
                .sync()
                .parse("bad", "SELECT 2", &[])
                .bind("", "bad", &[])
                .execute("", 0)
                .sync()
                .bind("", "bad", &[])
                .execute("", 0)
                .sync(),
            3,
        )],
    );
}

#[test]
fn portals_with_row_limits_and_flush_match() {
    let rig = Rig::start(1);
    rig.compare(
        "one portal executed one row, two rows, then the rest",
        &[ready(
            Batch::new()
                .parse("", "SELECT g FROM generate_series(1, 5) g", &[])
                .bind("p1", "", &[])
                .execute("p1", 1)
                .execute("p1", 2)
                .execute("p1", 0)
                .sync(),
            1,
        )],
    );
    rig.compare(
        "Flush, then Sync",
        &[
            until_tag(
                Batch::new()
                    .parse("", "SELECT g FROM generate_series(1, 3) g", &[])
                    .bind("c1", "", &[])
                    .execute("c1", 1)
                    .flush(),
                b's',
            ),
            until_tag(Batch::new().execute("c1", 1).flush(), b's'),
            ready(Batch::new().execute("c1", 0).sync(), 1),
            until_tag(
                Batch::new()
                    .parse("fl", "SELECT $1::int", &[])
                    .bind("", "fl", &[Some("5")])
                    .execute("", 0)
                    .flush(),
                b'C',
            ),
            ready(Batch::new().sync(), 1),
        ],
    );
    rig.compare(
        "named portal of a named statement across batches of a transaction",
        &[
            ready(Batch::new().query("BEGIN"), 1),
            ready(
                Batch::new()
                    .parse(
                        "s5",
                        "SELECT g, g * $1::int FROM generate_series(1, 4) g",
                        &[],
                    )
                    .bind("p5", "s5", &[Some("10")])
                    .execute("p5", 2)
                    .sync(),
                1,
            ),
            ready(Batch::new().execute("p5", 0).sync(), 1),
            ready(
                Batch::new()
                    .close(b'P', "p5")
                    .close(b'S', "s5")
                    .execute("p5", 0)
                    .sync(),
                1,
            ),
            ready(Batch::new().query("COMMIT"), 1),
        ],
    );
}

#[test]
fn errors_mid_pipeline_match() {
    let rig = Rig::start(1);
    let insert = |b: Batch, v: &str| b.unnamed("INSERT INTO t VALUES ($1::int)", &[Some(v)]);
    let second = insert(insert(Batch::new(), "2").parse("", "SELECT 1/0", &[]), "3");
    rig.compare(
        "three batches, the second with an error",
        &[ready(
            Batch {
                bytes: [
                    insert(Batch::new(), "1").sync().bytes,
                    second.bind("", "", &[]).execute("", 0).sync().bytes,
                    insert(Batch::new(), "4").sync().bytes,
                ]
                .concat(),
            }
            .query("SELECT string_agg(a::text, ',' ORDER BY a) FROM t"),
            4,
        )],
    );
    rig.compare(
        "named statements across the three batches",
        &[ready(
            Batch::new()
                .parse("ins", "INSERT INTO t VALUES ($1::int)", &[])
                .bind("", "ins", &[Some("1")])
                .execute("", 0)
                .sync()
                .bind("", "ins", &[Some("2")])
                .execute("", 0)
                .bind("", "ins", &[Some("two")])
                .execute("", 0)
                .parse("skipped", "SELECT 1", &[])
                .sync()
                .bind("", "ins", &[Some("4")])
                .execute("", 0)
                .bind("", "skipped", &[])
                .execute("", 0)
                .sync()
                .query("SELECT string_agg(a::text, ',' ORDER BY a) FROM t"),
            4,
        )],
    );
    rig.compare(
        "an error at commit, raised by the Sync",
        &[ready(
            Batch::new()
                .unnamed("INSERT INTO d VALUES (1), (1)", &[])
                .sync()
                .query("SELECT count(*) FROM d"),
            2,
        )],
    );
}

#[test]
fn close_deallocate_and_discard_match() {
    let rig = Rig::start(1);
    rig.compare(
        "Close of statements and portals, then re-Parse of the name with other text",
        &[
            ready(
                Batch::new()
                    .parse("s2", "SELECT 2", &[])
                    .bind("p2", "s2", &[])
                    .close(b'P', "p2")
                    .close(b'S', "s2")
                    .close(b'S', "never")
                    .close(b'P', "never")
                    .sync(),
                1,
            ),
            ready(Batch::new().bind("", "s2", &[]).execute("", 0).sync(), 1),
            ready(
                Batch::new()
                    .parse("s2", "SELECT 'other'::text AS o", &[])
                    .describe(b'S', "s2")
                    .bind("", "s2", &[])
                    .execute("", 0)
                    .sync(),
                1,
            ),
        ],
    );
    rig.compare(
        "DEALLOCATE of one statement",
        &[
            ready(Batch::new().parse("s3", "SELECT 3", &[]).sync(), 1),
            ready(Batch::new().query("DEALLOCATE s3"), 1),
            ready(Batch::new().bind("", "s3", &[]).execute("", 0).sync(), 1),
            ready(Batch::new().query("DEALLOCATE s3"), 1),
        ],
    );
    rig.compare(
        "DEALLOCATE with comments, and of a quoted name with a space",
        &[
            ready(
                Batch::new()
                    .parse("S 6", "SELECT 6", &[])
                    .parse("s7", "SELECT 7", &[])
                    .sync(),
                1,
            ),
            ready(
                Batch::new().query("/* app */ DEALLOCATE \"S 6\" -- done"),
                1,
            ),
            ready(Batch::new().query("DEALLOCATE /* x */ PREPARE s7;"), 1),
            ready(Batch::new().bind("", "s7", &[]).execute("", 0).sync(), 1),
            ready(Batch::new().bind("", "S 6", &[]).execute("", 0).sync(), 1),
        ],
    );
    for reset in ["DEALLOCATE ALL", "DISCARD ALL", "-- reset\nDISCARD ALL"] {
        rig.compare(
            reset,
            &[
                ready(
                    Batch::new()
                        .parse("s4", "SELECT 4", &[])
                        .parse("s5", "SELECT 5", &[])
                        .sync(),
                    1,
                ),
                ready(Batch::new().query(reset), 1),
                ready(Batch::new().bind("", "s4", &[]).execute("", 0).sync(), 1),
                ready(
                    Batch::new()
                        .parse("s5", "SELECT 'five'::text", &[])
                        .bind("", "s5", &[])
                        .execute("", 0)
                        .sync(),
                    1,
                ),
            ],
        );
    }
}

/// With room for one statement per server, statements are closed and prepared again behind
/// the client's back; what the client sees must not change, including after a DEALLOCATE ALL
/// or DISCARD ALL sent in the same pipeline as the messages that follow it.
#[test]
fn eviction_and_resets_in_a_pipeline_match() {
    let rig = Rig::start_with(1, "max_prepared_statements = 1\n");
    rig.compare(
        "two statements in turn with room for one",
        &[
            ready(
                Batch::new()
                    .parse("a", "SELECT 'a'::text || $1::text", &[])
                    .parse("b", "SELECT 'b'::text || $1::text", &[])
                    .bind("", "a", &[Some("1")])
                    .execute("", 0)
                    .bind("", "b", &[Some("2")])
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(
                Batch::new()
                    .bind("", "a", &[Some("3")])
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(
                Batch::new()
                    .bind("", "b", &[Some("4")])
                    .execute("", 0)
                    .sync(),
                1,
            ),
            ready(
                Batch::new()
                    .bind("", "a", &[Some("5")])
                    .execute("", 0)
                    .sync()
                    .bind("", "b", &[Some("6")])
                    .execute("", 0)
                    .sync(),
                2,
            ),
        ],
    );
    for reset in ["DISCARD ALL", "DEALLOCATE ALL"] {
        rig.compare(
            &format!("{reset} pipelined with a Bind of a statement the server no longer has"),
            &[
                ready(
                    Batch::new()
                        .parse("a", "SELECT 'a'::text", &[])
                        .sync()
                        .parse("b", "SELECT 'b'::text", &[])
                        .sync(),
                    2,
                ),
                ready(
                    Batch::new()
                        .query(reset)
                        .bind("", "a", &[])
                        .execute("", 0)
                        .sync(),
                    2,
                ),
            ],
        );
    }
}

#[test]
fn copy_matches() {
    let rig = Rig::start(1);
    let rows = |b: Batch| b.copy_data(b"1\tone\n").copy_data(b"2\ttwo\n");
    rig.compare(
        "COPY FROM STDIN, simple protocol",
        &[
            until_tag(Batch::new().query("COPY c FROM STDIN"), b'G'),
            ready(rows(Batch::new()).copy_done(), 1),
            ready(
                Batch::new().query("SELECT string_agg(b, ',' ORDER BY a) FROM c"),
                1,
            ),
        ],
    );
    rig.compare(
        "CopyFail",
        &[
            until_tag(Batch::new().query("COPY c FROM STDIN"), b'G'),
            ready(rows(Batch::new()).copy_fail("the client gave up"), 1),
            ready(Batch::new().query("SELECT count(*) FROM c"), 1),
        ],
    );
    rig.compare(
        "an error before CopyDone",
        &[
            until_tag(Batch::new().query("COPY c FROM STDIN"), b'G'),
            ready(
                rows(Batch::new())
                    .copy_data(b"not a number\tx\n")
                    .copy_data(b"3\tthree\n")
                    .copy_done(),
                1,
            ),
            ready(Batch::new().query("SELECT count(*) FROM c"), 1),
        ],
    );
    rig.compare(
        "an error after CopyDone (a deferred constraint at commit)",
        &[
            until_tag(Batch::new().query("COPY d FROM STDIN"), b'G'),
            ready(Batch::new().copy_data(b"1\n1\n").copy_done(), 1),
            ready(Batch::new().query("SELECT count(*) FROM d"), 1),
        ],
    );
    rig.compare(
        "COPY TO STDOUT, simple and extended",
        &[ready(
            Batch::new()
                .query("COPY (SELECT g, 'v' || g FROM generate_series(1, 3) g) TO STDOUT")
                .parse(
                    "out",
                    "COPY (SELECT g FROM generate_series(1, 4) g) TO STDOUT",
                    &[],
                )
                .bind("", "out", &[])
                .execute("", 0)
                .sync(),
            2,
        )],
    );
    copy_in_extended(&rig);
}

fn copy_in_extended(rig: &Rig) {
    let rows = |b: Batch| b.copy_data(b"1\tone\n").copy_data(b"2\ttwo\n");
    rig.compare(
        "COPY FROM STDIN, extended protocol, named statement",
        &[
            until_tag(
                Batch::new()
                    .parse("cp", "COPY c FROM STDIN", &[])
                    .bind("", "cp", &[])
                    .execute("", 0),
                b'G',
            ),
            ready(rows(Batch::new()).copy_done().sync(), 1),
            until_tag(
                Batch::new().bind("", "cp", &[]).execute("", 0).flush(),
                b'G',
            ),
            ready(
                Batch::new()
                    .copy_data(b"3\tthree\n")
                    .copy_done()
                    .unnamed("SELECT string_agg(b, ',' ORDER BY a) FROM c", &[])
                    .sync(),
                1,
            ),
        ],
    );
    rig.compare(
        "CopyFail and errors around CopyDone, extended protocol",
        &[
            until_tag(Batch::new().unnamed("COPY c FROM STDIN", &[]), b'G'),
            ready(rows(Batch::new()).copy_fail("no more").sync(), 1),
            until_tag(Batch::new().unnamed("COPY c FROM STDIN", &[]), b'G'),
            ready(
                Batch::new()
                    .copy_data(b"x\n")
                    .copy_done()
                    .unnamed("SELECT 1", &[])
                    .sync(),
                1,
            ),
            until_tag(Batch::new().unnamed("COPY d FROM STDIN", &[]), b'G'),
            ready(Batch::new().copy_data(b"5\n5\n").copy_done().sync(), 1),
            ready(
                Batch::new().query("SELECT count(*) FROM c UNION ALL SELECT count(*) FROM d"),
                1,
            ),
        ],
    );
}

/// A statement prepared in one transaction and used in later ones, while another client
/// holds the server it was prepared on, so pgward must prepare it on a second server.
#[test]
fn a_named_statement_follows_its_client_to_another_server() {
    let rig = Rig::start(2);
    let steps = [
        ready(
            Batch::new()
                .parse("q", "SELECT $1::int * 3 AS v", &[23])
                .sync(),
            1,
        ),
        ready(
            Batch::new()
                .bind("", "q", &[Some("14")])
                .describe(b'P', "")
                .execute("", 0)
                .sync(),
            1,
        ),
        ready(Batch::new().describe(b'S', "q").sync(), 1),
        ready(
            Batch::new()
                .bind("pq", "q", &[Some("-2")])
                .execute("pq", 0)
                .close(b'S', "q")
                .bind("", "q", &[Some("1")])
                .sync(),
            1,
        ),
    ];
    let direct = run(rig.pg.port, &steps, |_| {});
    let mut holder: Option<Raw> = None;
    let pooled = run(rig.pgward.port, &steps, |i| {
        if i == 1 {
            // The only server pgward has opened is idle: this transaction takes it.
            let mut conn = Raw::login(rig.pgward.port, USER, None, "app");
            conn.value("BEGIN");
            holder = Some(conn);
        }
        if i == 3 {
            if let Some(mut conn) = holder.take() {
                conn.value("COMMIT");
                conn.terminate();
            }
        }
    });
    assert_same(
        "statement used on a second server",
        &direct,
        &pooled,
        &rig.pgward,
    );
    let servers = rig.pg.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'trustuser' \
         AND backend_type = 'client backend'",
    );
    assert_eq!(servers, "2", "pgward should have opened a second server");
}
