//! A TCP relay on 127.0.0.1 in front of PostgreSQL, standing for a slow network between
//! pgward and its server.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use super::HOST;

/// How a [`slow_relay`] slows the way from pgward to PostgreSQL down.
#[derive(Clone, Copy)]
pub struct Slowness {
    /// A cancel request's connection stays open this long after the request was passed on.
    pub cancel_hold: Duration,
    /// A cancel request is passed on this long after it came (a postmaster slow to take it).
    pub cancel_delay: Duration,
    /// A connection's first packet (an SSLRequest, a startup packet) is passed on this long
    /// after it came (a server slow to answer a connect).
    pub first_packet_delay: Duration,
    /// Bytes towards PostgreSQL go in pieces of `.0` bytes, `.1` apart.
    pub pace: Option<(usize, Duration)>,
}

/// A TCP relay on 127.0.0.1 to PostgreSQL at port `target`, standing for a slow network; its
/// port.
pub fn slow_relay(target: u16, slowness: Slowness) -> u16 {
    let listener = TcpListener::bind((HOST, 0)).expect("bind the relay");
    let port = listener.local_addr().expect("relay address").port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            thread::spawn(move || relay_one(stream, target, slowness));
        }
    });
    port
}

fn relay_one(mut inbound: TcpStream, target: u16, slowness: Slowness) {
    let mut head = [0u8; 8];
    if inbound.read_exact(&mut head).is_err() {
        return;
    }
    let cancel = head[4..8] == 80_877_102u32.to_be_bytes();
    let mut key = [0u8; 8];
    if !cancel {
        thread::sleep(slowness.first_packet_delay);
    }
    if cancel {
        if inbound.read_exact(&mut key).is_err() {
            return;
        }
        thread::sleep(slowness.cancel_delay);
    }
    let Ok(mut outbound) = TcpStream::connect((HOST, target)) else {
        return;
    };
    if outbound.write_all(&head).is_err() {
        return;
    }
    if cancel {
        if outbound.write_all(&key).is_ok() {
            let mut ack = [0u8; 1];
            let _ = outbound.read(&mut ack);
            thread::sleep(slowness.cancel_hold);
        }
        return;
    }
    let (Ok(in_copy), Ok(out_copy)) = (inbound.try_clone(), outbound.try_clone()) else {
        return;
    };
    thread::spawn(move || pipe(in_copy, out_copy, slowness.pace));
    pipe(outbound, inbound, None);
}

/// Copies `from` to `to` (at `pace`, if given) until either side ends, then closes both.
fn pipe(mut from: TcpStream, mut to: TcpStream, pace: Option<(usize, Duration)>) {
    let (piece, gap) = pace.unwrap_or((64 * 1024, Duration::ZERO));
    let mut buf = vec![0u8; piece];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        if !gap.is_zero() {
            thread::sleep(gap);
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A relay to PostgreSQL at port `target` that passes everything on except the first Parse
/// (of any connection) whose statement name starts with `prefix`: its text becomes `sql`.
/// It makes one of pgward's own statements slow, so that a cancel surely lands on it.
pub fn rewriting_relay(target: u16, prefix: &'static str, sql: &'static str) -> u16 {
    rewriting_relay_at(target, (prefix, 0), sql)
}

/// [`rewriting_relay`] rewriting the Parse numbered `nth` (from 0) of those named `prefix...`.
pub fn rewriting_relay_at(
    target: u16,
    (prefix, nth): (&'static str, usize),
    sql: &'static str,
) -> u16 {
    rewriting_relay_over(target, (prefix, nth..nth + 1), sql)
}

/// [`rewriting_relay`] rewriting the Parses numbered `which` (from 0) of those named
/// `prefix...`.
pub fn rewriting_relay_over(
    target: u16,
    (prefix, which): (&'static str, std::ops::Range<usize>),
    sql: &'static str,
) -> u16 {
    let listener = TcpListener::bind((HOST, 0)).expect("bind the relay");
    let port = listener.local_addr().expect("relay address").port();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let seen = std::sync::Arc::clone(&seen);
            let which = which.clone();
            thread::spawn(move || rewrite_one(stream, target, (prefix, which, sql), &seen));
        }
    });
    port
}

/// Reads one message, untagged (a startup packet) or tagged: its header and its body.
fn read_packet(from: &mut TcpStream, tagged: bool) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut head = vec![0u8; if tagged { 5 } else { 4 }];
    from.read_exact(&mut head).ok()?;
    let at = head.len() - 4;
    let len = u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let mut body = vec![0u8; (len as usize).saturating_sub(4)];
    from.read_exact(&mut body).ok()?;
    Some((head, body))
}

fn rewrite_one(
    mut inbound: TcpStream,
    target: u16,
    (prefix, which, sql): (&str, std::ops::Range<usize>, &str),
    seen: &std::sync::atomic::AtomicUsize,
) {
    let Ok(mut outbound) = TcpStream::connect((HOST, target)) else {
        return;
    };
    let (Ok(back_from), Ok(back_to)) = (outbound.try_clone(), inbound.try_clone()) else {
        return;
    };
    thread::spawn(move || pipe(back_from, back_to, None));
    // Untagged packets (an SSLRequest, then the startup packet or a cancel request).
    loop {
        let Some((head, body)) = read_packet(&mut inbound, false) else {
            return;
        };
        if outbound.write_all(&[head, body.clone()].concat()).is_err() {
            return;
        }
        if body.get(..4) != Some(&80_877_103u32.to_be_bytes()[..]) {
            break;
        }
    }
    while let Some((head, body)) = read_packet(&mut inbound, true) {
        let mut out = [&head[..], &body[..]].concat();
        let name_end = body.iter().position(|b| *b == 0).unwrap_or(0);
        if head[0] == b'P'
            && body[..name_end].starts_with(prefix.as_bytes())
            && which.contains(&seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst))
        {
            let text_end = name_end
                + 1
                + body[name_end + 1..]
                    .iter()
                    .position(|b| *b == 0)
                    .unwrap_or(0);
            let rest = &body[text_end + 1..];
            let new_body = [&body[..=name_end], sql.as_bytes(), &[0], rest].concat();
            out = super::raw::message(b'P', &new_body);
        }
        if outbound.write_all(&out).is_err() {
            break;
        }
    }
    let _ = inbound.shutdown(Shutdown::Both);
    let _ = outbound.shutdown(Shutdown::Both);
}
