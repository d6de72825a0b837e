//! TCP keepalive: `tcp_keepalive`, `tcp_keepidle`, `tcp_keepintvl` and `tcp_keepcnt` are set
//! on pgward's client and server sockets, and a client whose machine vanishes (no FIN, no RST:
//! its network link goes down) is noticed and its connection closed.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{eventually, psql_at, Pgward, Postgres};

const KEEPALIVE: &str = "tcp_keepalive = 1\ntcp_keepidle = 1\ntcp_keepintvl = 1\ntcp_keepcnt = 2\n";

/// pgward's established TCP sockets matching the `ss` filter, one line each.
fn sockets(filter: &str) -> Vec<String> {
    let out = Command::new("ss")
        .args(["-tnoH", "state", "established", filter])
        .output()
        .expect("ss (iproute2)");
    assert!(out.status.success(), "ss: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn keepalive_is_set_on_client_and_server_sockets() {
    let pg = Postgres::start();
    let pw = Pgward::trusting(&pg, KEEPALIVE, "");
    let mut client = Command::new(common::client_program("psql"))
        .args(["-X", "-h", "127.0.0.1", "-p", &pw.port.to_string()])
        .args([
            "-U",
            "postgres",
            "-d",
            "app",
            "-c",
            "SELECT 1",
            "-c",
            "\\! sleep 5",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("psql");
    // The client's socket as pgward accepted it, and pgward's socket to PostgreSQL.
    let accepted = format!("( sport = :{} )", pw.port);
    let to_server = format!("( dport = :{} )", pg.port);
    let armed = |lines: Vec<String>| {
        !lines.is_empty() && lines.iter().all(|l| l.contains("timer:(keepalive,"))
    };
    let found = eventually(Duration::from_secs(4), || {
        armed(sockets(&accepted)) && armed(sockets(&to_server))
    });
    let _ = client.kill();
    let _ = client.wait();
    assert!(
        found,
        "no keepalive timer on pgward's sockets:\nclient side: {:?}\nserver side: {:?}",
        sockets(&accepted),
        sockets(&to_server)
    );
}

/// A network namespace joined to this one by a veth pair: host side `HOST_IP`, namespace
/// side `CLIENT_IP`. Removed when dropped.
struct Netns {
    name: String,
    host_link: String,
    client_link: String,
}

const HOST_IP: &str = "10.213.7.1";
const CLIENT_IP: &str = "10.213.7.2";

impl Netns {
    /// `None` when this machine cannot make one (not root, no veth): the reason.
    fn create() -> Result<Netns, String> {
        let id = std::process::id() % 100_000;
        let ns = Netns {
            name: format!("pgward-ka-{id}"),
            host_link: format!("pwkh{id}"),
            client_link: format!("pwkc{id}"),
        };
        ns.ip(&["netns", "add", &ns.name])?;
        ns.ip(&[
            "link",
            "add",
            &ns.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &ns.client_link,
        ])?;
        ns.ip(&["link", "set", &ns.client_link, "netns", &ns.name])?;
        ns.ip(&[
            "addr",
            "add",
            &format!("{HOST_IP}/30"),
            "dev",
            &ns.host_link,
        ])?;
        ns.ip(&["link", "set", &ns.host_link, "up"])?;
        let client_addr = format!("{CLIENT_IP}/30");
        ns.inside(&["addr", "add", &client_addr, "dev", &ns.client_link])?;
        ns.inside(&["link", "set", &ns.client_link, "up"])?;
        ns.inside(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn ip(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }

    /// `ip ARGS` inside the namespace.
    fn inside(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        self.ip(&all)
    }

    /// The namespace's machine vanishes: its link goes down, nothing more leaves it.
    fn vanish(&self) {
        self.inside(&["link", "set", &self.client_link, "down"])
            .expect("link down");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.ip(&["link", "del", &self.host_link]);
        let _ = self.ip(&["netns", "del", &self.name]);
    }
}

/// psql from inside the namespace, logged in to pgward and idle (in a shell command) for a
/// minute, once it has printed its query's answer: nothing of pgward's is then left
/// unacknowledged, which would leave the connection to retransmission rather than keepalive.
fn idle_client(ns: &Netns, port: u16) -> Child {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(common::client_program("psql"))
        .args([
            "-X",
            "-At",
            "-h",
            HOST_IP,
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-d", "app", "-c", "SELECT 'answered'", "-c", "\\! sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("psql in the namespace");
    let stdout = child.stdout.take().expect("psql's output");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(15)).unwrap_or_default();
    assert_eq!(
        line.trim(),
        "answered",
        "psql in the namespace got no answer"
    );
    // Its acknowledgement of the answer has left too.
    std::thread::sleep(Duration::from_millis(500));
    child
}

fn clients(pw: &Pgward) -> String {
    let out = psql_at(pw.port, "admin", None, "pgward", "SHOW CLIENTS");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_client_whose_machine_vanishes_is_noticed() {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(why) => {
            // Only root can make a network namespace; CI runs as root.
            eprintln!("skipped: cannot make a network namespace here: {why}");
            return;
        }
    };
    let pg = Postgres::start();
    let settings = format!("{KEEPALIVE}admin_users = admin\n");
    let listen = format!("127.0.0.1,{HOST_IP}");
    let pw = Pgward::start_listening_on(
        &Pgward::ini(&pg, &format!("auth_type = trust\n{settings}"), ""),
        &listen,
    );
    let mut client = idle_client(&ns, pw.port);
    let connected = eventually(Duration::from_secs(10), || clients(&pw).contains(CLIENT_IP));
    assert!(
        connected,
        "the client never logged in: {}\n{}",
        clients(&pw),
        pw.log()
    );
    ns.vanish();
    // Keepalive: 1 s idle, then 2 probes 1 s apart: gone within about 3 s.
    let noticed = eventually(Duration::from_secs(15), || {
        !clients(&pw).contains(CLIENT_IP)
    });
    let _ = client.kill();
    let _ = client.wait();
    assert!(
        noticed,
        "the vanished client is still there: {}",
        clients(&pw)
    );
}
