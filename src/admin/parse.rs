//! The console's command language: one command per query, keywords in any case, an optional
//! trailing semicolon, values bare or in single quotes.

/// A parsed console command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `SHOW what` (lowercased).
    Show(String),
    /// `SHOW STATEMENTS [n] [FOR tenant]`: the `n` statements with the most total time (100
    /// when not given), of `tenant` only if named.
    ShowStatements {
        limit: usize,
        tenant: Option<String>,
    },
    Pause(Option<String>),
    Resume(Option<String>),
    Suspend,
    Disable(String),
    Enable(String),
    Reconnect(Option<String>),
    Kill(Option<String>),
    /// `KILL_CLIENT id`, the id as written.
    KillClient(String),
    WaitClose(Option<String>),
    Shutdown(ShutdownKind),
    Reload,
    Set {
        key: String,
        value: String,
    },
    SetUser {
        name: String,
        value: String,
    },
    SetPool {
        key: String,
        value: String,
    },
    /// `SET TENANT name = 'words'`.
    SetTenant {
        name: String,
        value: String,
    },
    /// `KILL TENANT name FOR 'duration' [SOFT]` or `KILL STATEMENT fingerprint FOR
    /// 'duration' [SOFT]`, the duration as written. `SOFT` refuses only new requests; without
    /// it, what waits is refused and what runs is cancelled as well.
    KillFor {
        target: Target,
        duration: String,
        soft: bool,
    },
    /// `UNKILL TENANT name` or `UNKILL STATEMENT fingerprint`.
    Unkill(Target),
    /// An empty query.
    Empty,
}

/// The SHUTDOWN variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownKind {
    Now,
    WaitForServers,
    WaitForClients,
}

/// What an incident kill names, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A tenant's name.
    Tenant(String),
    /// A statement's fingerprint in hex.
    Statement(String),
}

impl Target {
    /// `TENANT name` or `STATEMENT fingerprint`.
    fn of(kind: &Token, name: &Token) -> Option<Target> {
        let name = name.text().to_string();
        match kind.keyword()?.as_str() {
            "tenant" => Some(Target::Tenant(name)),
            "statement" => Some(Target::Statement(name)),
            _ => None,
        }
    }
}

/// Why a query is not a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid command '{0}', use SHOW HELP;")]
    Invalid(String),
    #[error("unterminated quoted string")]
    Unterminated,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted(String),
    Equals,
}

impl Token {
    fn text(&self) -> &str {
        match self {
            Token::Word(s) | Token::Quoted(s) => s,
            Token::Equals => "=",
        }
    }

    fn keyword(&self) -> Option<String> {
        match self {
            Token::Word(s) => Some(s.to_ascii_lowercase()),
            _ => None,
        }
    }
}

fn tokenize(sql: &str) -> Result<Vec<Token>, ParseError> {
    let mut tokens = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '=' {
            chars.next();
            tokens.push(Token::Equals);
        } else if c == '\'' || c == '"' {
            chars.next();
            tokens.push(Token::Quoted(quoted(&mut chars, c)?));
        } else {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() || c == '=' || c == '\'' || c == '"' {
                    break;
                }
                word.push(c);
                chars.next();
            }
            tokens.push(Token::Word(word));
        }
    }
    Ok(tokens)
}

/// Reads up to the closing `q`; a doubled `q` stands for one.
fn quoted(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    q: char,
) -> Result<String, ParseError> {
    let mut out = String::new();
    while let Some(c) = chars.next() {
        if c == q {
            if chars.peek() == Some(&q) {
                chars.next();
                out.push(q);
            } else {
                return Ok(out);
            }
        } else {
            out.push(c);
        }
    }
    Err(ParseError::Unterminated)
}

/// SHOW STATEMENTS' arguments: `[n] [FOR tenant]`.
fn show_statements(args: &[Token]) -> Option<Command> {
    let (limit, rest) = match args.first().map(|t| t.text().parse::<usize>()) {
        Some(Ok(n)) => (n, &args[1..]),
        _ => (DEFAULT_STATEMENTS, args),
    };
    let tenant = match rest {
        [] => None,
        [word, name] if word.keyword().as_deref() == Some("for") => Some(name.text().to_string()),
        _ => return None,
    };
    Some(Command::ShowStatements { limit, tenant })
}

/// Rows SHOW STATEMENTS lists when not told.
pub const DEFAULT_STATEMENTS: usize = 100;

/// Parses one console query.
pub fn parse(sql: &str) -> Result<Command, ParseError> {
    let trimmed = sql.trim().trim_end_matches(';').trim();
    if trimmed.is_empty() {
        return Ok(Command::Empty);
    }
    let invalid = || ParseError::Invalid(trimmed.to_string());
    let tokens = tokenize(trimmed)?;
    let verb = tokens
        .first()
        .and_then(Token::keyword)
        .ok_or_else(invalid)?;
    let args = tokens.get(1..).unwrap_or_default();
    let arg = |i: usize| args.get(i).map(|t| t.text().to_string());
    let optional_db = || match args.len() {
        0 => Ok(None),
        1 => Ok(arg(0)),
        _ => Err(invalid()),
    };
    let one = || match args.len() {
        1 => arg(0).ok_or_else(invalid),
        _ => Err(invalid()),
    };
    // SELECT is SHOW's other name on PgBouncer's console.
    let verb = match verb.as_str() {
        "select" => "show".to_string(),
        _ => verb,
    };
    let cmd = match verb.as_str() {
        "show" if args.first().and_then(Token::keyword).as_deref() == Some("statements") => {
            show_statements(&args[1..]).ok_or_else(invalid)?
        }
        "show" => Command::Show(one()?.to_ascii_lowercase()),
        "pause" => Command::Pause(optional_db()?),
        "resume" => Command::Resume(optional_db()?),
        "suspend" if args.is_empty() => Command::Suspend,
        "disable" => Command::Disable(one()?),
        "enable" => Command::Enable(one()?),
        "reconnect" => Command::Reconnect(optional_db()?),
        "kill" => match kill(args) {
            Some(cmd) => cmd,
            None => Command::Kill(optional_db()?),
        },
        "unkill" => unkill(args).ok_or_else(invalid)?,
        "kill_client" => Command::KillClient(one()?),
        "wait_close" => Command::WaitClose(optional_db()?),
        "reload" if args.is_empty() => Command::Reload,
        "shutdown" => Command::Shutdown(shutdown_kind(args).ok_or_else(invalid)?),
        "set" => set(args).ok_or_else(invalid)?,
        _ => return Err(invalid()),
    };
    Ok(cmd)
}

fn shutdown_kind(args: &[Token]) -> Option<ShutdownKind> {
    match args {
        [] => Some(ShutdownKind::Now),
        [t] => match t.keyword()?.as_str() {
            "wait_for_servers" => Some(ShutdownKind::WaitForServers),
            "wait_for_clients" => Some(ShutdownKind::WaitForClients),
            _ => None,
        },
        _ => None,
    }
}

/// `KILL TENANT name FOR duration` / `KILL STATEMENT fingerprint FOR duration`; any other
/// KILL is the PgBouncer command (`KILL [db]`).
fn kill(args: &[Token]) -> Option<Command> {
    let (soft, args) = match args {
        [rest @ .., last] if last.keyword().as_deref() == Some("soft") => (true, rest),
        _ => (false, args),
    };
    let [kind, name, word, duration] = args else {
        return None;
    };
    if word.keyword()? != "for" || *name == Token::Equals || *duration == Token::Equals {
        return None;
    }
    Some(Command::KillFor {
        target: Target::of(kind, name)?,
        duration: duration.text().to_string(),
        soft,
    })
}

/// `UNKILL TENANT name` / `UNKILL STATEMENT fingerprint`.
fn unkill(args: &[Token]) -> Option<Command> {
    match args {
        [kind, name] if *name != Token::Equals => Target::of(kind, name).map(Command::Unkill),
        _ => None,
    }
}

/// `SET key = value`, `SET USER name = value`, `SET POOL user.db = value`,
/// `SET TENANT name = value`; `TO` in place of `=` and a double-quoted key, as PgBouncer reads
/// them.
fn set(args: &[Token]) -> Option<Command> {
    let equals = |t: &Token| *t == Token::Equals || t.keyword().as_deref() == Some("to");
    match args {
        [key, eq, value] if equals(eq) => Some(Command::Set {
            key: match key {
                Token::Equals => return None,
                _ => key.text().to_ascii_lowercase(),
            },
            value: value.text().to_string(),
        }),
        [kind, name, eq, value] if equals(eq) => {
            let name = name.text().to_string();
            let value = value.text().to_string();
            match kind.keyword()?.as_str() {
                "user" => Some(Command::SetUser { name, value }),
                "pool" => Some(Command::SetPool { key: name, value }),
                "tenant" => Some(Command::SetTenant { name, value }),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        assert_eq!(parse("show POOLS;").unwrap(), Command::Show("pools".into()));
        assert_eq!(
            parse("SELECT pools").unwrap(),
            Command::Show("pools".into())
        );
        let statements = |limit, tenant: Option<&str>| Command::ShowStatements {
            limit,
            tenant: tenant.map(str::to_string),
        };
        assert_eq!(parse("SHOW STATEMENTS").unwrap(), statements(100, None));
        assert_eq!(parse("show statements 5;").unwrap(), statements(5, None));
        assert_eq!(
            parse("SHOW STATEMENTS 5 FOR 'acme'").unwrap(),
            statements(5, Some("acme"))
        );
        assert_eq!(
            parse("SHOW STATEMENTS for acme").unwrap(),
            statements(100, Some("acme"))
        );
        assert!(parse("SHOW STATEMENTS acme").is_err());
        assert!(parse("SHOW STATEMENTS 5 FOR").is_err());
        assert_eq!(parse("PAUSE").unwrap(), Command::Pause(None));
        assert_eq!(
            parse("pause p0 ;").unwrap(),
            Command::Pause(Some("p0".into()))
        );
        assert_eq!(
            parse("kill_client 12").unwrap(),
            Command::KillClient("12".into())
        );
        assert_eq!(
            parse("shutdown wait_for_clients").unwrap(),
            Command::Shutdown(ShutdownKind::WaitForClients)
        );
        assert_eq!(parse("  ").unwrap(), Command::Empty);
        assert!(parse("pause a b").is_err());
        assert!(parse("frobnicate").is_err());
        assert!(parse("disable").is_err());
    }

    #[test]
    fn set_forms() {
        assert_eq!(
            parse("set server_login_retry=1").unwrap(),
            Command::Set {
                key: "server_login_retry".into(),
                value: "1".into()
            }
        );
        assert_eq!(
            parse("SET admin_users = 'a,b'").unwrap(),
            Command::Set {
                key: "admin_users".into(),
                value: "a,b".into()
            }
        );
        assert_eq!(
            parse("SET USER app = 'max_user_connections=40 pool_size=3';").unwrap(),
            Command::SetUser {
                name: "app".into(),
                value: "max_user_connections=40 pool_size=3".into()
            }
        );
        assert_eq!(
            parse("set pool app.db = 'pool_size=30'").unwrap(),
            Command::SetPool {
                key: "app.db".into(),
                value: "pool_size=30".into()
            }
        );
        assert_eq!(
            parse("set user = 'x'").unwrap(),
            Command::Set {
                key: "user".into(),
                value: "x".into()
            }
        );
        assert_eq!(
            parse("set x = 'it''s'").unwrap(),
            Command::Set {
                key: "x".into(),
                value: "it's".into()
            }
        );
        assert!(parse("set x = 'open").is_err());
        assert!(parse("set x").is_err());
        // PgBouncer's other spellings.
        let pool_size = Command::Set {
            key: "default_pool_size".into(),
            value: "30".into(),
        };
        assert_eq!(parse("SET default_pool_size TO 30;").unwrap(), pool_size);
        assert_eq!(parse("set \"default_pool_size\" = 30").unwrap(), pool_size);
        assert_eq!(
            parse("SET USER app TO 'pool_size=3'").unwrap(),
            Command::SetUser {
                name: "app".into(),
                value: "pool_size=3".into()
            }
        );
        assert!(parse("set = = 1").is_err());
    }

    #[test]
    fn gate_commands() {
        assert_eq!(
            parse("SET TENANT acme = 'rate=10 burst=20';").unwrap(),
            Command::SetTenant {
                name: "acme".into(),
                value: "rate=10 burst=20".into()
            }
        );
        assert_eq!(
            parse("kill tenant acme for '10m'").unwrap(),
            Command::KillFor {
                target: Target::Tenant("acme".into()),
                duration: "10m".into(),
                soft: false,
            }
        );
        assert_eq!(
            parse("kill tenant acme for '10m' soft").unwrap(),
            Command::KillFor {
                target: Target::Tenant("acme".into()),
                duration: "10m".into(),
                soft: true,
            }
        );
        assert_eq!(
            parse("KILL STATEMENT 00ab12cd34ef5678 FOR 30s").unwrap(),
            Command::KillFor {
                target: Target::Statement("00ab12cd34ef5678".into()),
                duration: "30s".into(),
                soft: false,
            }
        );
        assert_eq!(
            parse("UNKILL TENANT \"Acme Corp\"").unwrap(),
            Command::Unkill(Target::Tenant("Acme Corp".into()))
        );
        assert_eq!(
            parse("unkill statement '00ab'").unwrap(),
            Command::Unkill(Target::Statement("00ab".into()))
        );
        assert_eq!(
            parse("show plan_cache").unwrap(),
            Command::Show("plan_cache".into())
        );
        for bad in [
            "kill tenant acme",
            "kill tenant acme for",
            "kill tenant acme until '10m'",
            "kill tenant acme for '10m' hard",
            "kill tenant acme soft",
            "kill user acme for '10m'",
            "kill tenant = for '10m'",
            "unkill acme",
            "unkill tenant",
            "unkill tenant a b",
            "set tenant acme",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kill_of_a_database_still_parses() {
        assert_eq!(parse("KILL").unwrap(), Command::Kill(None));
        assert_eq!(
            parse("kill app;").unwrap(),
            Command::Kill(Some("app".into()))
        );
        // A database may be named like a keyword: only `KILL kind name FOR duration` is a
        // gate kill.
        assert_eq!(
            parse("KILL tenant").unwrap(),
            Command::Kill(Some("tenant".into()))
        );
        assert_eq!(
            parse("kill statement").unwrap(),
            Command::Kill(Some("statement".into()))
        );
        assert!(parse("kill a b").is_err());
    }
}
