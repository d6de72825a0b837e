//! The bad-input suite: a running pgward is attacked while pgbench runs through it, and
//! pgbench must finish with no failed transaction while pgward's memory stays bounded.
//! Attacks: malformed and truncated startup packets (lengths 0, 3, -1 and 2^31-1), random
//! bytes after login, a message over max_packet_size, 5,000 half-open connections against
//! max_client_conn, slow logins (client_login_timeout), a storm of wrong passwords (the
//! throttle engages), cancel requests with random keys, TLS handshakes that stop halfway.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rand::{Rng, RngCore};

use common::certs::Ca;
use common::raw::{self, Raw, PROTOCOL_3_0};
use common::{stderr_of, stdout_of, write_userlist, Pgward, Postgres};

/// Long enough to open every half-open connection before the first one times out.
const LOGIN_TIMEOUT_SECS: u64 = 5;
const MAX_PACKET: usize = 1 << 20;
const HALF_OPEN: usize = 5_000;
const MAX_CLIENT_CONN: usize = 2_000;
/// pgward's resident memory may not pass this at any time during the attacks.
const RSS_LIMIT_KB: u64 = 400 * 1024;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The resident memory of process `pid` in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Samples pgward's resident memory every 100 ms and keeps the largest value.
struct RssWatch {
    max: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl RssWatch {
    fn start(pid: u32) -> RssWatch {
        let max = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (max.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                m.fetch_max(rss_kb(pid), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(100));
            }
        });
        RssWatch {
            max,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.max.load(Ordering::Relaxed)
    }
}

/// Raises this process's open files limit to its hard limit.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Sends `bytes` on a new connection and checks that pgward closes it within `wait`.
fn closed_after(port: u16, bytes: &[u8], wait: Duration) -> bool {
    let mut client = Raw::connect(port);
    client.send(bytes);
    client.closes_within(wait)
}

fn malformed_startup_packets(port: u16) {
    let wait = Duration::from_secs(LOGIN_TIMEOUT_SECS + 10);
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("length 0".into(), vec![0, 0, 0, 0]),
        ("length 3".into(), vec![0, 0, 0, 3]),
        ("length -1".into(), vec![0xff, 0xff, 0xff, 0xff, 0, 3, 0, 0]),
        (
            "length 2^31-1".into(),
            vec![0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0],
        ),
        ("truncated".into(), {
            let mut p = raw::startup_packet(PROTOCOL_3_0, &[("user", "md5user")]);
            p.truncate(p.len() / 2);
            p
        }),
        (
            "unknown version".into(),
            raw::untagged(&[0x12, 0x34, 0x56, 0x78, 0]),
        ),
        (
            "no terminator".into(),
            raw::untagged(&[0, 3, 0, 0, b'u', b's', b'e', b'r']),
        ),
        (
            "odd parameters".into(),
            raw::untagged(&[0, 3, 0, 0, b'u', 0, 0]),
        ),
        (
            "short cancel".into(),
            raw::untagged(&[0x04, 0xd2, 0x16, 0x2e, 1, 2]),
        ),
        ("v2 startup".into(), raw::untagged(&[0, 2, 0, 0, 0, 0])),
    ];
    let mut rng = rand::thread_rng();
    for i in 0..100 {
        let len = rng.gen_range(1..600);
        let mut bytes = vec![0u8; len];
        rng.fill_bytes(&mut bytes);
        cases.push((format!("random {i}"), bytes));
    }
    for (name, bytes) in cases {
        assert!(closed_after(port, &bytes, wait), "{name}: not closed");
    }
}

/// A login as `user` with an MD5 password exchange; `Err` holds the refusal's SQLSTATE.
fn md5_login(port: u16, user: &str, password: &str) -> Result<Raw, String> {
    let mut client = Raw::connect(port);
    client.send(&raw::startup_packet(
        PROTOCOL_3_0,
        &[("user", user), ("database", "app")],
    ));
    let first = client.read_message().map_err(|e| format!("{e:?}"))?;
    if first.tag == b'E' {
        return Err(raw::Fields::parse(&first.body).code().to_string());
    }
    let salt: [u8; 4] = first
        .body
        .get(4..8)
        .and_then(|s| s.try_into().ok())
        .ok_or("no salt")?;
    client.send(&raw::password_message(&raw::md5_password(
        user, password, &salt,
    )));
    client.finish_login().map_err(|f| f.code().to_string())?;
    Ok(client)
}

fn random_bytes_after_login(port: u16) {
    let mut rng = rand::thread_rng();
    for _ in 0..20 {
        let mut client = md5_login(port, "md5user", "md5pass").expect("login");
        let mut junk = vec![0u8; rng.gen_range(1..8192)];
        rng.fill_bytes(&mut junk);
        client.send(&junk);
        // Either pgward refuses the garbage, or it waits for the rest of a message it
        // believes has begun; closing our side must end the session either way.
        let _ = client.closes_within(Duration::from_millis(500));
    }
}

fn message_over_max_packet_size(port: u16) {
    let mut client = md5_login(port, "md5user", "md5pass").expect("login");
    let len = (MAX_PACKET as u32) * 8;
    let mut header = vec![b'Q'];
    header.extend_from_slice(&len.to_be_bytes());
    header.extend_from_slice(&[b'x'; 1024]);
    client.send(&header);
    let err = client.expect_error();
    assert_eq!(err.code(), "08P01", "{}", err.message());
    assert!(client.closes_within(Duration::from_secs(5)));
}

fn half_open_connections(pw: &Pgward) {
    raise_fd_limit();
    let started = Instant::now();
    let mut held = Vec::with_capacity(HALF_OPEN);
    for _ in 0..HALF_OPEN {
        match TcpStream::connect_timeout(&addr(pw.port), Duration::from_secs(5)) {
            Ok(s) => held.push(s),
            Err(e) => panic!("connection {} failed: {e}", held.len()),
        }
    }
    let opened = started.elapsed();
    assert!(
        opened < Duration::from_secs(LOGIN_TIMEOUT_SECS),
        "opening took {opened:?}, past client_login_timeout"
    );
    // max_client_conn holds: a real login is refused while they are open.
    let mut client = Raw::connect(pw.port);
    let refused = client
        .startup(&[("user", "md5user"), ("database", "app")])
        .unwrap_err();
    assert_eq!(refused.code(), "53300", "{}", refused.message());
    assert!(refused.message().contains("max_client_conn"));
    drop(held);
    // And is counted: once they are gone, logins work again.
    assert!(
        common::eventually(Duration::from_secs(LOGIN_TIMEOUT_SECS + 5), || md5_login(
            pw.port, "md5user", "md5pass"
        )
        .is_ok()),
        "logins did not come back after the half-open connections closed"
    );
}

fn slow_logins(port: u16) {
    let started = Instant::now();
    let mut slow: Vec<Raw> = (0..50)
        .map(|_| {
            let mut c = Raw::connect(port);
            c.send(&raw::startup_packet(
                PROTOCOL_3_0,
                &[("user", "md5user"), ("database", "app")],
            ));
            c
        })
        .collect();
    for c in &mut slow {
        let left = Duration::from_secs(LOGIN_TIMEOUT_SECS + 5).saturating_sub(started.elapsed());
        assert!(
            c.closes_within(left),
            "a slow login outlived client_login_timeout"
        );
    }
}

fn wrong_password_storm(port: u16) {
    let mut codes = Vec::new();
    for _ in 0..15 {
        codes.push(
            md5_login(port, "md5user", "guess")
                .err()
                .unwrap_or_default(),
        );
    }
    assert!(codes[..10].iter().all(|c| c == "28P01"), "{codes:?}");
    assert!(codes[10..].iter().all(|c| c == "28000"), "{codes:?}");
    // The right password is refused too while the block lasts.
    assert_eq!(
        md5_login(port, "md5user", "md5pass").err().as_deref(),
        Some("28000")
    );
}

fn random_cancels(pw: &Pgward) {
    let port = pw.port;
    let sleeper = thread::spawn(move || {
        let out = common::psql_at(
            port,
            "postgres",
            Some("benchpass"),
            "app",
            "SELECT pg_sleep(3), 'done'",
        );
        (out.status.success(), stdout_of(&out), stderr_of(&out))
    });
    let mut rng = rand::thread_rng();
    for _ in 0..500 {
        let mut secret = [0u8; 4];
        rng.fill_bytes(&mut secret);
        let mut c = Raw::connect(port);
        c.send(&raw::cancel_request(rng.gen(), &secret));
        assert!(c.closes_within(Duration::from_secs(5)));
    }
    let (ok, out, err) = sleeper.join().unwrap();
    assert!(
        ok && out.ends_with("|done"),
        "a statement was cancelled: {out} {err}"
    );
}

fn tls_handshakes_stop_halfway(port: u16) {
    let started = Instant::now();
    let mut held = Vec::new();
    for i in 0..100 {
        let mut s = Raw::connect(port);
        if i % 2 == 0 {
            s.send(&raw::ssl_request());
            assert_eq!(s.read_byte(), Ok(b'S'));
        }
        // The start of a TLS record carrying a ClientHello, and no more.
        s.send(&[
            0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
        ]);
        held.push(s);
    }
    let deadline = started + Duration::from_secs(LOGIN_TIMEOUT_SECS + 5);
    for mut s in held {
        let left = deadline.saturating_duration_since(Instant::now());
        let closed = s.closes_within(left.max(Duration::from_millis(1)));
        assert!(
            closed,
            "a half-done TLS handshake outlived client_login_timeout"
        );
    }
}

#[test]
fn attacks_while_pgbench_runs() {
    let pg = Postgres::start();
    let init = pg.pgbench(&["-i", "-s", "1", "-q"]);
    assert!(init.status.success(), "{}", stderr_of(&init));
    let dir = common::shared_tempdir("pgward-bad-");
    let ca = Ca::new("bad input CA");
    let server = ca.issue(dir.path(), "server", "localhost", &["127.0.0.1"]);
    let userlist = write_userlist(
        dir.path(),
        &[
            ("md5user", &common::md5_secret("md5user", "md5pass")),
            ("postgres", "benchpass"),
        ],
    );
    let settings = format!(
        "auth_type = md5\nauth_file = {}\npool_mode = transaction\nmax_client_conn = {MAX_CLIENT_CONN}\n\
         client_login_timeout = {LOGIN_TIMEOUT_SECS}\nmax_packet_size = {MAX_PACKET}\nlisten_backlog = 4096\n\
         client_tls_sslmode = prefer\nclient_tls_cert_file = {}\nclient_tls_key_file = {}\n",
        userlist.display(),
        server.cert.display(),
        server.key.display()
    );
    let pw = Pgward::start(&Pgward::ini(&pg, &settings, ""));
    let watch = RssWatch::start(pw.pid());
    let port = pw.port;
    let bench = thread::spawn(move || {
        common::pgbench_at(
            port,
            Some("benchpass"),
            &["-c", "4", "-j", "2", "-T", "45", "-n"],
        )
    });
    thread::sleep(Duration::from_secs(1));
    let phases: [(&str, &dyn Fn()); 8] = [
        ("malformed startup packets", &|| {
            malformed_startup_packets(port)
        }),
        ("random bytes after login", &|| {
            random_bytes_after_login(port)
        }),
        ("message over max_packet_size", &|| {
            message_over_max_packet_size(port)
        }),
        ("half-open connections", &|| half_open_connections(&pw)),
        ("slow logins", &|| slow_logins(port)),
        ("TLS handshakes stopped halfway", &|| {
            tls_handshakes_stop_halfway(port)
        }),
        ("cancel requests with random keys", &|| random_cancels(&pw)),
        ("wrong password storm", &|| wrong_password_storm(port)),
    ];
    for (name, phase) in phases {
        let started = Instant::now();
        phase();
        eprintln!(
            "{name}: {:?}, pgward VmRSS {} kB",
            started.elapsed(),
            rss_kb(pw.pid())
        );
    }
    let out = bench.join().unwrap();
    let max_rss = watch.finish();
    common::pgbench_clean(&out, "beside the bad input", &pw.log());
    eprintln!("pgward's largest VmRSS: {max_rss} kB");
    assert!(max_rss < RSS_LIMIT_KB, "pgward used {max_rss} kB");
    assert!(!pw.log().contains("panicked"), "{}", pw.log());
}
