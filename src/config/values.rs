//! Value parsers shared by the `[pgbouncer]` settings and the connection-string sections.
//!
//! Numbers in `[pgbouncer]` follow C's `strtol(s, &end, 0)` as PgBouncer uses it: optional
//! leading blanks and sign, `0x` for hexadecimal, a leading `0` for octal (so `0777` is 511),
//! and nothing may follow the number. Times are seconds as a decimal number with an optional
//! fraction or exponent (C's `strtod`); units are not accepted, negative values are refused.
//! Booleans are numbers: 0 is false, anything else is true (PgBouncer stores them as ints).

use std::time::Duration;

/// Parses an integer the way C's `strtol` with base 0 does, refusing trailing garbage.
pub fn c_long(s: &str) -> Option<i64> {
    let s = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, s.get(1..)?),
        Some(b'+') => (false, s.get(1..)?),
        _ => (false, s),
    };
    let (radix, body) = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (16, hex)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, digits.get(1..)?)
    } else {
        (10, digits)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i64::from_str_radix(body, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// A C `int` setting.
pub fn int(s: &str) -> Result<i32, String> {
    c_long(s)
        .and_then(|v| i32::try_from(v).ok())
        .ok_or_else(|| "not an integer".to_string())
}

/// A non-negative C `int` setting.
pub fn count(s: &str) -> Result<u32, String> {
    let v = int(s)?;
    u32::try_from(v).map_err(|_| "must not be negative".to_string())
}

/// A count of at most `max`.
pub fn count_at_most(s: &str, max: u32) -> Result<u32, String> {
    let v = count(s)?;
    match v <= max {
        true => Ok(v),
        false => Err(format!("must be at most {max}")),
    }
}

/// A boolean stored as an integer: 0 is false, anything else true.
pub fn boolean(s: &str) -> Result<bool, String> {
    int(s).map(|v| v != 0)
}

/// Seconds with an optional fraction, truncated to microseconds as PgBouncer stores them.
pub fn seconds(s: &str) -> Result<Duration, String> {
    let t = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let plain_number = !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    let v: f64 = match t.parse() {
        Ok(v) if plain_number => v,
        _ => return Err("not a number of seconds".to_string()),
    };
    if v.is_nan() || v < 0.0 {
        return Err("must not be negative".to_string());
    }
    let micros = v * 1_000_000.0;
    if micros >= u64::MAX as f64 {
        return Err("too large".to_string());
    }
    Ok(Duration::from_micros(micros as u64))
}

/// Seconds where zero means "disabled".
pub fn timeout(s: &str) -> Result<Option<Duration>, String> {
    seconds(s).map(|d| (!d.is_zero()).then_some(d))
}

/// A comma-separated list; items are trimmed and empty items dropped.
pub fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

/// A string where the empty string means "not set".
pub fn optional(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// A decimal integer in a connection string (`pool_size=10`, `port=5432`).
///
/// PgBouncer reads these with `atoi`, which silently turns garbage into 0; here garbage is
/// refused instead.
pub fn cstr_int(s: &str) -> Result<i64, String> {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid number: {s}"));
    }
    s.parse().map_err(|_| format!("number out of range: {s}"))
}

/// A connection-string count where a negative number means "not set" (PgBouncer uses -1).
pub fn cstr_count(s: &str) -> Result<Option<u32>, String> {
    let v = cstr_int(s)?;
    if v < 0 {
        return Ok(None);
    }
    u32::try_from(v)
        .map(Some)
        .map_err(|_| format!("number out of range: {s}"))
}

/// Whole seconds in a connection string; a negative number means "not set".
pub fn cstr_seconds(s: &str) -> Result<Option<Duration>, String> {
    let v = cstr_int(s)?;
    Ok(u64::try_from(v).ok().map(Duration::from_secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_long_bases() {
        assert_eq!(c_long("42"), Some(42));
        assert_eq!(c_long(" -7"), Some(-7));
        assert_eq!(c_long("+7"), Some(7));
        assert_eq!(c_long("0777"), Some(0o777));
        assert_eq!(c_long("0x1F"), Some(31));
        assert_eq!(c_long("0"), Some(0));
        for bad in ["", "08", "0x", "12a", "1.5", "abc", "-", "1 "] {
            assert_eq!(c_long(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn ints_and_bools() {
        assert_eq!(int("2147483647"), Ok(i32::MAX));
        assert!(int("2147483648").is_err());
        assert!(count("-1").is_err());
        assert_eq!(boolean("0"), Ok(false));
        assert_eq!(boolean("1"), Ok(true));
        assert_eq!(boolean("2"), Ok(true));
        for word in ["yes", "on", "true", "off"] {
            assert!(boolean(word).is_err(), "{word}");
        }
    }

    #[test]
    fn seconds_parsing() {
        assert_eq!(seconds("15"), Ok(Duration::from_secs(15)));
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("2.5e1"), Ok(Duration::from_secs(25)));
        assert_eq!(seconds(".25"), Ok(Duration::from_millis(250)));
        assert_eq!(seconds("0.0000015"), Ok(Duration::from_micros(1)));
        for bad in ["", "-1", "5s", "1min", "inf", "nan", "abc", "1e400"] {
            assert!(seconds(bad).is_err(), "{bad:?}");
        }
        assert_eq!(timeout("0"), Ok(None));
        assert_eq!(timeout("0.0"), Ok(None));
        assert_eq!(timeout("3"), Ok(Some(Duration::from_secs(3))));
    }

    #[test]
    fn lists() {
        assert_eq!(list(" a, b ,,c "), vec!["a", "b", "c"]);
        assert!(list("").is_empty());
    }

    #[test]
    fn connstring_numbers() {
        assert_eq!(cstr_count("10"), Ok(Some(10)));
        assert_eq!(cstr_count("-1"), Ok(None));
        assert!(cstr_count("10x").is_err());
        assert!(cstr_count("").is_err());
        assert_eq!(cstr_seconds("30"), Ok(Some(Duration::from_secs(30))));
        assert_eq!(cstr_seconds("-1"), Ok(None));
    }
}
