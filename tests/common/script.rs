//! A scripted PostgreSQL server on 127.0.0.1, for what a real one will not do: stay mute,
//! answer with a message that breaks the protocol, or log pgward in without proving its SCRAM
//! signature. Each connection is served on a thread of its own, following one [`Script`].

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use super::raw::{self, cstr};
use super::HOST;

/// How a scripted server authenticates pgward.
#[derive(Clone, Copy)]
pub enum ScriptedAuth {
    Trust,
    /// A SCRAM exchange that ends with AuthenticationOk and no SASLFinal.
    ScramWithoutSignature,
}

/// What a [`ScriptedServer`] does with each connection.
#[derive(Clone, Copy)]
pub enum Script {
    /// Accepts the connection and answers nothing, reading until the peer closes.
    Mute,
    /// A PostgreSQL lookalike: it logs pgward in as `auth` says, reports the usual parameters,
    /// answers SET with CommandComplete and every other query with `answer`.
    Answer {
        auth: ScriptedAuth,
        answer: &'static [u8],
    },
}

/// A server on 127.0.0.1 that plays a [`Script`] to every connection.
pub struct ScriptedServer {
    pub port: u16,
    /// How long each connection lasted, as each ends.
    ended: Receiver<Duration>,
}

impl ScriptedServer {
    pub fn start(script: Script) -> ScriptedServer {
        let listener = TcpListener::bind((HOST, 0)).expect("bind the scripted server");
        let port = listener
            .local_addr()
            .expect("scripted server address")
            .port();
        let (tell, ended) = mpsc::channel();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let tell = tell.clone();
                thread::spawn(move || {
                    let accepted = Instant::now();
                    let _ = play(stream, script);
                    let _ = tell.send(accepted.elapsed());
                });
            }
        });
        ScriptedServer { port, ended }
    }

    /// How long each of the next `count` connections to end lasted, from its accept to its
    /// end; fewer when no other connection ends within ten seconds.
    pub fn lifetimes(&self, count: usize) -> Vec<Duration> {
        let wait = Duration::from_secs(10);
        (0..count)
            .map_while(|_| self.ended.recv_timeout(wait).ok())
            .collect()
    }
}

fn play(mut stream: TcpStream, script: Script) -> io::Result<()> {
    match script {
        Script::Mute => {
            let mut sink = [0u8; 1024];
            while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
            Ok(())
        }
        Script::Answer { auth, answer } => serve(stream, auth, answer),
    }
}

fn read_startup(stream: &mut TcpStream) -> io::Result<u32> {
    loop {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len)?;
        let len = u32::from_be_bytes(len) as usize;
        let mut body = vec![0u8; len.saturating_sub(4).min(10_000)];
        stream.read_exact(&mut body)?;
        let code = body
            .get(..4)
            .map_or(0, |c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        if code == 80_877_103 || code == 80_877_104 {
            stream.write_all(b"N")?;
            continue;
        }
        return Ok(code);
    }
}

fn read_tagged(stream: &mut TcpStream) -> io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0u8; len.saturating_sub(4).min(1 << 20)];
    stream.read_exact(&mut body)?;
    Ok((head[0], body))
}

fn auth_message(code: u32, data: &[u8]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    body.extend_from_slice(data);
    raw::message(b'R', &body)
}

fn serve(mut stream: TcpStream, auth: ScriptedAuth, answer: &[u8]) -> io::Result<()> {
    if read_startup(&mut stream)? != raw::PROTOCOL_3_0 {
        return Ok(());
    }
    if let ScriptedAuth::ScramWithoutSignature = auth {
        scram_without_signature(&mut stream)?;
    }
    let mut out = auth_message(0, &[]);
    for (name, value) in [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("IntervalStyle", "postgres"),
        ("TimeZone", "UTC"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("application_name", ""),
        ("is_superuser", "off"),
    ] {
        out.extend_from_slice(&raw::message(b'S', &[cstr(name), cstr(value)].concat()));
    }
    out.extend_from_slice(&raw::message(b'K', &[0, 0, 4, 210, 1, 2, 3, 4]));
    out.extend_from_slice(&raw::message(b'Z', b"I"));
    stream.write_all(&out)?;
    loop {
        let (tag, body) = read_tagged(&mut stream)?;
        match tag {
            b'Q' if body.to_ascii_uppercase().starts_with(b"SET ") => {
                let done = [raw::message(b'C', b"SET\0"), raw::message(b'Z', b"I")];
                stream.write_all(&done.concat())?;
            }
            b'Q' => stream.write_all(answer)?,
            b'X' => return Ok(()),
            _ => {}
        }
    }
}

/// Plays the server's side of SCRAM-SHA-256 up to the client's proof, which it accepts
/// without ever sending its own signature.
fn scram_without_signature(stream: &mut TcpStream) -> io::Result<()> {
    stream.write_all(&auth_message(10, b"SCRAM-SHA-256\0\0"))?;
    let (_, first) = read_tagged(stream)?;
    let text = String::from_utf8_lossy(&first).into_owned();
    let nonce = text
        .split(',')
        .find_map(|part| part.strip_prefix("r="))
        .unwrap_or("")
        .trim_end_matches('\0')
        .to_string();
    let server_first = format!("r={nonce}scripted,s=c2FsdHNhbHRzYWx0c2FsdA==,i=4096");
    stream.write_all(&auth_message(11, server_first.as_bytes()))?;
    let _client_final = read_tagged(stream)?;
    Ok(())
}
