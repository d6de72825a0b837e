//! `key=value` lists used as values in `[databases]`, `[users]`, `[peers]` and `[pools]`.
//!
//! The rules are PgBouncer's (not libpq's): pairs are separated by blanks; a value is either
//! a run of non-blank characters or is enclosed in single quotes, where `''` stands for one
//! quote (a backslash is an ordinary character). Empty values are refused. Keys are
//! case-sensitive.

/// Splits a connection string into its pairs, in order.
pub fn parse(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
        if rest.is_empty() {
            return Ok(pairs);
        }
        let (key, after_key) = take_key(rest)?;
        let (value, after_value) = take_value(after_key)?;
        pairs.push((key.to_string(), value));
        rest = after_value;
    }
}

fn take_key(s: &str) -> Result<(&str, &str), String> {
    let end = s
        .find(|c: char| c == '=' || c.is_ascii_whitespace())
        .unwrap_or(s.len());
    let (key, rest) = s.split_at(end);
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
    match rest.strip_prefix('=') {
        Some(rest) if !key.is_empty() => Ok((key, rest)),
        _ => Err(format!("syntax error in connection string near \"{s}\"")),
    }
}

fn take_value(s: &str) -> Result<(String, &str), String> {
    let s = s.trim_start_matches(|c: char| c.is_ascii_whitespace());
    let (value, rest) = match s.strip_prefix('\'') {
        Some(quoted) => unquote(quoted)?,
        None => {
            let end = s.find(|c: char| c.is_ascii_whitespace()).unwrap_or(s.len());
            let (value, rest) = s.split_at(end);
            (value.to_string(), rest)
        }
    };
    if value.is_empty() {
        return Err("empty value in connection string".to_string());
    }
    Ok((value, rest))
}

/// Reads a quoted value after its opening quote; returns it and what follows the close.
fn unquote(s: &str) -> Result<(String, &str), String> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '\'' {
            value.push(c);
            continue;
        }
        let after = s.get(i + 1..).unwrap_or("");
        if after.starts_with('\'') {
            value.push('\'');
            chars.next();
            continue;
        }
        if !after.is_empty() && !after.starts_with(|c: char| c.is_ascii_whitespace()) {
            return Err("connection string: junk after quoted value".to_string());
        }
        return Ok((value, after));
    }
    Err("connection string: unterminated quoted value".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &str) -> Vec<(String, String)> {
        parse(s).unwrap()
    }

    #[test]
    fn plain_and_quoted() {
        assert_eq!(
            pairs("  host=db1 port = 5433  connect_query='SELECT ''a b''' password='x\\y'"),
            vec![
                ("host".into(), "db1".into()),
                ("port".into(), "5433".into()),
                ("connect_query".into(), "SELECT 'a b'".into()),
                ("password".into(), "x\\y".into()),
            ]
        );
        assert!(pairs("").is_empty());
        assert!(pairs("   ").is_empty());
    }

    #[test]
    fn errors() {
        for bad in [
            "host", "=x", "host=''", "host=", "a='x", "a='x'b=1", "host = ",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
