//! The pgward executable: reads a pgbouncer.ini-compatible file and serves until told to stop.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pgward::config::{self, Config};

const USAGE: &str = "\
pgward - a PostgreSQL connection pooler that reads pgbouncer.ini

Usage: pgward [OPTION]... CONFIG
       pgward check --policy POLICY.toml CORPUS.sql...
       pgward simulate --policy POLICY.toml --traffic TRAFFIC.jsonl

Options:
  -v, --verbose    log more (repeat for even more)
  -q, --quiet      log nothing to stderr
  -d, --daemon     accepted for compatibility; pgward stays in the foreground
  -V, --version    print the version and exit
  -h, --help       print this help and exit

CONFIG is a pgbouncer.ini-style file: [databases], [users], [pools] and
[pgbouncer] (or [pgward]) sections, with %include.

`pgward check` runs the cases of each corpus file (`-- reject [rule]`, `-- warn [rule]`,
`-- allow` before each case) against a policy file without starting the pooler, prints
every case it gets wrong as `file:line: want ..., got ...`, and exits 1 if there is one.

`pgward simulate` replays a traffic log (`[traffic] file` in a policy) through the
admission gate under another policy, in simulated time, and reports per tenant what
that policy would have refused, delayed and let through beside what happened.";

struct Args {
    config: PathBuf,
    verbose: i32,
    quiet: bool,
}

enum Command {
    Run(Args),
    Exit(ExitCode),
}

fn parse_args() -> Command {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("check") {
        return Command::Exit(check(&args[1..]));
    }
    if args.first().map(String::as_str) == Some("simulate") {
        return Command::Exit(simulate(&args[1..]));
    }
    let mut config = None;
    let mut verbose = 0;
    let mut quiet = false;
    for arg in args {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Command::Exit(ExitCode::SUCCESS);
            }
            "-V" | "--version" => {
                println!("pgward {}", env!("CARGO_PKG_VERSION"));
                return Command::Exit(ExitCode::SUCCESS);
            }
            "-v" | "--verbose" => verbose += 1,
            "-q" | "--quiet" => quiet = true,
            "-d" | "--daemon" => {}
            a if a.starts_with("-v") && a[1..].chars().all(|c| c == 'v') => {
                verbose += (a.len() - 1) as i32
            }
            a if a.starts_with('-') => {
                eprintln!("pgward: unknown option {a}\n\n{USAGE}");
                return Command::Exit(ExitCode::from(2));
            }
            a => config = Some(PathBuf::from(a)),
        }
    }
    match config {
        Some(config) => Command::Run(Args {
            config,
            verbose,
            quiet,
        }),
        None => {
            eprintln!("pgward: no configuration file given\n\n{USAGE}");
            Command::Exit(ExitCode::from(2))
        }
    }
}

/// `pgward check --policy FILE CORPUS...`
fn check(args: &[String]) -> ExitCode {
    let (policy, corpus) = match args {
        [flag, policy, corpus @ ..] if flag == "--policy" && !corpus.is_empty() => (policy, corpus),
        _ => {
            eprintln!("usage: pgward check --policy POLICY.toml CORPUS.sql...");
            return ExitCode::from(2);
        }
    };
    let corpus: Vec<PathBuf> = corpus.iter().map(PathBuf::from).collect();
    match pgward::check::run_check(Path::new(policy), &corpus) {
        Ok(report) => {
            print!("{report}");
            ExitCode::from(report.exit_code() as u8)
        }
        Err(e) => {
            eprintln!("pgward check: {e}");
            ExitCode::from(2)
        }
    }
}

/// `pgward simulate --policy FILE --traffic FILE`
fn simulate(args: &[String]) -> ExitCode {
    let usage = || {
        eprintln!("usage: pgward simulate --policy POLICY.toml --traffic TRAFFIC.jsonl");
        ExitCode::from(2)
    };
    let (mut policy, mut traffic) = (None, None);
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().map(PathBuf::from);
        match flag.as_str() {
            "--policy" => policy = value,
            "--traffic" => traffic = value,
            _ => return usage(),
        }
    }
    let (Some(policy), Some(traffic)) = (policy, traffic) else {
        return usage();
    };
    match pgward::simulate::run_simulation(&policy, &traffic) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pgward simulate: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Command::Run(a) => a,
        Command::Exit(code) => return code,
    };
    let config = match config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pgward: {e}");
            return ExitCode::FAILURE;
        }
    };
    let log = match init_logging(&config, &args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pgward: cannot open logfile: {e}");
            return ExitCode::FAILURE;
        }
    };
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    let threads = config.settings.worker_threads.max(1);
    let started = current_thread().and_then(|rt| Ok((start_workers(threads - 1)?, rt)));
    match started {
        Ok((others, rt)) => {
            let here = (rt.handle().clone(), std::thread::current().id());
            let threads = std::iter::once(here).chain(others).collect();
            let workers = pgward::workers::Workers::new(threads);
            rt.block_on(pgward::daemon::serve(config, log, workers))
        }
        Err(e) => {
            eprintln!("pgward: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A runtime for one thread: each worker thread runs one, the daemon's thread too.
fn current_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Starts `n` worker threads besides the daemon's, each running its own runtime for the life
/// of the process, and returns their runtimes' handles and the threads.
fn start_workers(
    n: usize,
) -> std::io::Result<Vec<(tokio::runtime::Handle, std::thread::ThreadId)>> {
    (1..=n)
        .map(|i| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name(format!("pgward-worker-{i}"))
                .spawn(move || match current_thread() {
                    Ok(rt) => {
                        let me = std::thread::current().id();
                        let _ = tx.send(Ok((rt.handle().clone(), me)));
                        rt.block_on(std::future::pending::<()>());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                })?;
            rx.recv()
                .map_err(|_| std::io::Error::other("a worker thread ended as it started"))?
        })
        .collect()
}

/// Sets up pgward's own log: the log file, when `logfile` names one (opened again at every
/// reload), and its level, which a reload or SET verbose changes.
fn init_logging(config: &Config, args: &Args) -> std::io::Result<pgward::daemon::Logging> {
    use pgward::ops::logfile::{level_for, LogFile, LogLevel};
    use pgward::ops::syslog::{Syslog, SyslogWriter, SYSLOG_SOCKET};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let level = level_for(config.settings.verbose.max(0) + args.verbose);
    let (filter, handle) = tracing_subscriber::reload::Layer::new(level);
    let syslog = Syslog::new(SYSLOG_SOCKET);
    syslog.configure(&config.settings);
    let log = pgward::daemon::Logging {
        file: None,
        level: Some(LogLevel::new(handle, args.verbose)),
        syslog: Some(std::sync::Arc::clone(&syslog)),
    };
    // Lines are made for syslog only while it is on.
    let on = std::sync::Arc::clone(&syslog);
    let to_syslog = tracing_subscriber::fmt::layer()
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .with_writer(SyslogWriter(syslog))
        .with_filter(tracing_subscriber::filter::filter_fn(move |_| on.is_on()));
    let registry = tracing_subscriber::registry().with(filter).with(to_syslog);
    let layer = tracing_subscriber::fmt::layer().with_target(false);
    match &config.settings.logfile {
        Some(path) => {
            let file = std::sync::Arc::new(LogFile::open(path)?);
            let writer = std::sync::Arc::clone(&file);
            registry
                .with(layer.with_ansi(false).with_writer(writer))
                .init();
            return Ok(pgward::daemon::Logging {
                file: Some(file),
                ..log
            });
        }
        None if args.quiet => registry.with(layer.with_writer(std::io::sink)).init(),
        None => registry.with(layer.with_writer(std::io::stderr)).init(),
    }
    Ok(log)
}
