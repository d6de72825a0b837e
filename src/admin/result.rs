//! Result sets of the console: typed columns as PgBouncer declares them, values in text.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BytesMut;

use crate::wire;

/// Column types the console uses (PostgreSQL type OIDs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Text,
    Int4,
    Int8,
    Numeric,
}

impl Ty {
    fn oid_and_size(self) -> (u32, i16) {
        match self {
            Ty::Text => (25, -1),
            Ty::Int4 => (23, 4),
            Ty::Int8 => (20, 8),
            Ty::Numeric => (1700, -1),
        }
    }
}

/// One value: NULL, text, or a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    Null,
    Text(String),
    Int(i64),
}

impl Cell {
    /// A number with `places` decimals (NULL when it is not finite; no negative zero).
    pub fn decimal(v: f64, places: usize) -> Cell {
        if !v.is_finite() {
            return Cell::Null;
        }
        let text = format!("{v:.places$}");
        match text.strip_prefix('-') {
            Some(rest) if rest.chars().all(|c| c == '0' || c == '.') => Cell::Text(rest.into()),
            _ => Cell::Text(text),
        }
    }
}

impl From<&str> for Cell {
    fn from(s: &str) -> Self {
        Cell::Text(s.to_string())
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Self {
        Cell::Text(s)
    }
}

impl From<Option<String>> for Cell {
    fn from(s: Option<String>) -> Self {
        s.map_or(Cell::Null, Cell::Text)
    }
}

macro_rules! int_cell {
    ($($t:ty),*) => {
        $(impl From<$t> for Cell {
            fn from(n: $t) -> Self {
                Cell::Int(i64::try_from(n).unwrap_or(i64::MAX))
            }
        })*
    };
}
int_cell!(i64, u64, usize, u32, u16, i32, bool);

/// A result set being built.
#[derive(Debug, Clone)]
pub struct Table {
    columns: &'static [(&'static str, Ty)],
    rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(columns: &'static [(&'static str, Ty)]) -> Self {
        Table {
            columns,
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing trailing values are NULL, extra ones are dropped.
    pub fn push(&mut self, mut row: Vec<Cell>) {
        row.resize(self.columns.len(), Cell::Null);
        self.rows.push(row);
    }

    pub fn columns(&self) -> &'static [(&'static str, Ty)] {
        self.columns
    }

    pub fn rows(&self) -> &[Vec<Cell>] {
        &self.rows
    }

    /// RowDescription, the DataRows and CommandComplete `SHOW`.
    pub fn encode(&self, out: &mut BytesMut) {
        encode_row_description(out, self.columns);
        for row in &self.rows {
            let texts: Vec<Option<String>> = row
                .iter()
                .map(|c| match c {
                    Cell::Null => None,
                    Cell::Text(s) => Some(s.clone()),
                    Cell::Int(n) => Some(n.to_string()),
                })
                .collect();
            let values: Vec<Option<&[u8]>> = texts
                .iter()
                .map(|t| t.as_deref().map(str::as_bytes))
                .collect();
            wire::encode_data_row(out, &values);
        }
        wire::encode_command_complete(out, "SHOW");
    }
}

fn encode_row_description(out: &mut BytesMut, columns: &[(&str, Ty)]) {
    let columns = columns.iter().map(|(name, ty)| {
        let (oid, size) = ty.oid_and_size();
        (*name, oid, size)
    });
    wire::encode_row_description(out, columns);
}

/// A wall-clock time as PgBouncer prints it: `YYYY-MM-DD HH:MM:SS UTC`.
pub fn format_time(t: SystemTime) -> Cell {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    Cell::Text(format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    ))
}

/// The proleptic Gregorian date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        let t = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400 + 3661);
        assert_eq!(format_time(t), Cell::Text("2000-02-29 01:01:01 UTC".into()));
    }

    #[test]
    fn encodes_description_rows_and_tag() {
        const COLS: &[(&str, Ty)] = &[("a", Ty::Text), ("n", Ty::Int4)];
        let mut t = Table::new(COLS);
        t.push(vec!["x".into(), 5u32.into()]);
        t.push(vec![Cell::Null]);
        let mut out = BytesMut::new();
        t.encode(&mut out);
        assert_eq!(out[0], wire::backend::tag::ROW_DESCRIPTION);
        let rows = out
            .iter()
            .filter(|b| **b == wire::backend::tag::DATA_ROW)
            .count();
        assert!(rows >= 2);
        assert!(out.ends_with(b"SHOW\0"));
        assert_eq!(t.rows()[1], vec![Cell::Null, Cell::Null]);
    }

    #[test]
    fn decimals() {
        assert_eq!(Cell::decimal(1.0 / 3.0, 2), Cell::Text("0.33".into()));
        assert_eq!(Cell::decimal(-2.5, 1), Cell::Text("-2.5".into()));
        assert_eq!(Cell::decimal(-0.0001, 2), Cell::Text("0.00".into()));
        assert_eq!(Cell::decimal(12.0, 0), Cell::Text("12".into()));
        assert_eq!(Cell::decimal(f64::NAN, 2), Cell::Null);
        assert_eq!(Cell::decimal(f64::INFINITY, 2), Cell::Null);
    }
}
