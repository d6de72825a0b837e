//! SHOW STATS, STATS_TOTALS, STATS_AVERAGES and TOTALS: traffic per database and overall.

use super::result::{Cell, Table, Ty};
use crate::ops::stats::by_database;
use crate::ops::StatValues;
use crate::runtime::Runtime;

const N: Ty = Ty::Numeric;

const STATS: &[(&str, Ty)] = &[
    ("database", Ty::Text),
    ("total_server_assignment_count", N),
    ("total_xact_count", N),
    ("total_query_count", N),
    ("total_received", N),
    ("total_sent", N),
    ("total_xact_time", N),
    ("total_query_time", N),
    ("total_wait_time", N),
    ("total_client_parse_count", N),
    ("total_server_parse_count", N),
    ("total_bind_count", N),
    ("total_client_login_count", N),
    ("avg_server_assignment_count", N),
    ("avg_xact_count", N),
    ("avg_query_count", N),
    ("avg_recv", N),
    ("avg_sent", N),
    ("avg_xact_time", N),
    ("avg_query_time", N),
    ("avg_wait_time", N),
    ("avg_client_parse_count", N),
    ("avg_server_parse_count", N),
    ("avg_bind_count", N),
    ("avg_client_login_count", N),
];

const TOTALS: &[(&str, Ty)] = &[
    ("database", Ty::Text),
    ("server_assignment_count", N),
    ("xact_count", N),
    ("query_count", N),
    ("bytes_received", N),
    ("bytes_sent", N),
    ("xact_time", N),
    ("query_time", N),
    ("wait_time", N),
    ("client_parse_count", N),
    ("server_parse_count", N),
    ("bind_count", N),
    ("client_login_count", N),
];

/// STATS_AVERAGES: the columns of STATS_TOTALS, the last four named `avg_`.
const fn averages_columns() -> [(&'static str, Ty); 13] {
    let mut out = [("", N); 13];
    let mut i = 0;
    while i < 13 {
        out[i] = TOTALS[i];
        i += 1;
    }
    out[9].0 = "avg_client_parse_count";
    out[10].0 = "avg_server_parse_count";
    out[11].0 = "avg_bind_count";
    out[12].0 = "avg_client_login_count";
    out
}

const AVERAGES: &[(&str, Ty)] = &averages_columns();

/// The names of the rows of SHOW TOTALS, after `total_` or `avg_`.
const TOTAL_NAMES: [&str; 12] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "client_bytes",
    "server_bytes",
    "xact_time",
    "query_time",
    "wait_time",
    "ps_client_parse_count",
    "ps_server_parse_count",
    "ps_bind_count",
    "client_login_count",
];

/// (database, totals, averages) for every database with counters.
fn per_database(rt: &Runtime) -> Vec<(String, StatValues, StatValues)> {
    let totals = by_database(&rt.ops.stats.totals());
    let averages: Vec<_> = rt.ops.stats.averages().into_iter().collect();
    let averages = by_database(&averages);
    totals
        .into_iter()
        .map(|(db, t)| {
            let avg = averages
                .iter()
                .find(|(d, _)| *d == db)
                .map(|(_, a)| *a)
                .unwrap_or_default();
            (db, t, avg)
        })
        .collect()
}

fn cells(v: &StatValues) -> impl Iterator<Item = Cell> {
    v.as_row().into_iter().map(Cell::from)
}

pub fn stats(rt: &Runtime) -> Table {
    let mut t = Table::new(STATS);
    for (db, total, avg) in per_database(rt) {
        let row = std::iter::once(Cell::from(db))
            .chain(cells(&total))
            .chain(cells(&avg));
        t.push(row.collect());
    }
    t
}

pub fn totals(rt: &Runtime) -> Table {
    let mut t = Table::new(TOTALS);
    for (db, total, _) in per_database(rt) {
        t.push(
            std::iter::once(Cell::from(db))
                .chain(cells(&total))
                .collect(),
        );
    }
    t
}

pub fn averages(rt: &Runtime) -> Table {
    let mut t = Table::new(AVERAGES);
    for (db, _, avg) in per_database(rt) {
        t.push(std::iter::once(Cell::from(db)).chain(cells(&avg)).collect());
    }
    t
}

pub fn overall(rt: &Runtime) -> Table {
    const COLS: &[(&str, Ty)] = &[("name", Ty::Text), ("value", N)];
    let mut t = Table::new(COLS);
    let mut total = StatValues::default();
    let mut avg = StatValues::default();
    for (_, tv, av) in per_database(rt) {
        total = total.plus(&tv);
        avg = avg.plus(&av);
    }
    for (prefix, values) in [("total_", total), ("avg_", avg)] {
        for (name, v) in TOTAL_NAMES.iter().zip(values.as_row()) {
            t.push(vec![format!("{prefix}{name}").into(), v.into()]);
        }
    }
    t
}
