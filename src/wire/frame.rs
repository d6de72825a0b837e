//! Splitting a byte stream into protocol messages.
//!
//! After the startup phase every message is a tag byte, a big-endian Int32 length that counts
//! itself but not the tag, then the body. The startup phase has no tag: [`decode_startup`]
//! handles it.

use bytes::{Bytes, BytesMut};

use super::codec::{put_untagged, Reader};
use super::error::WireError;

/// Largest accepted tagged message (length field value), as in PostgreSQL (`PQ_LARGE_MESSAGE_LIMIT`).
pub const DEFAULT_MAX_MESSAGE_LEN: usize = 1 << 30;
/// Largest accepted startup-phase packet, as in PostgreSQL (`MAX_STARTUP_PACKET_LENGTH`).
pub const MAX_STARTUP_PACKET_LEN: usize = 10_000;
/// Size of the tag byte plus the length word.
pub const HEADER_LEN: usize = 5;

/// Request code of an SSLRequest packet.
pub const SSL_REQUEST_CODE: u32 = 80_877_103;
/// Request code of a GSSENCRequest packet.
pub const GSSENC_REQUEST_CODE: u32 = 80_877_104;
/// Request code of a CancelRequest packet.
pub const CANCEL_REQUEST_CODE: u32 = 80_877_102;
/// The one-byte answer to an SSLRequest that accepts it (a TLS handshake follows).
pub const ENCRYPTION_ACCEPTED: u8 = b'S';
/// The one-byte answer to an SSLRequest or GSSENCRequest that refuses it.
pub const ENCRYPTION_REFUSED: u8 = b'N';
/// Protocol version 3.0 as sent in a StartupMessage.
pub const PROTOCOL_3_0: u32 = 3 << 16;
/// Longest cancel secret accepted (protocol 3.2 allows up to 256 bytes).
pub const MAX_CANCEL_SECRET_LEN: usize = 256;

/// One whole tagged message: tag byte, length word and body, kept as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    raw: Bytes,
}

impl Frame {
    /// Wraps a complete raw message, checking that its length word matches its size.
    pub fn from_raw(raw: Bytes) -> Result<Self, WireError> {
        let mut buf = BytesMut::from(&raw[..]);
        match decode_frame(&mut buf, usize::MAX)? {
            Some(frame) if buf.is_empty() => Ok(frame),
            _ => Err(WireError::Malformed(
                "message length does not match its content",
            )),
        }
    }

    /// The message type byte.
    pub fn tag(&self) -> u8 {
        self.raw.first().copied().unwrap_or(0)
    }

    /// The body after the length word (a cheap reference-counted slice).
    pub fn body(&self) -> Bytes {
        self.raw.slice(HEADER_LEN.min(self.raw.len())..)
    }

    /// The whole message as received.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The whole message as received, by value.
    pub fn into_raw(self) -> Bytes {
        self.raw
    }

    /// Size of the whole message in bytes, tag included.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Always false: a frame holds at least its header.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
}

/// Reads a big-endian Int32 length word at the start of `buf`, if present.
fn peek_len(buf: &[u8]) -> Option<i32> {
    let word: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    Some(i32::from_be_bytes(word))
}

/// Checks a declared length against its lower and upper bounds.
fn check_len(len: i32, min: usize, max: usize) -> Result<usize, WireError> {
    let as_usize = usize::try_from(len).map_err(|_| WireError::BadLength(len.into()))?;
    if as_usize < min {
        return Err(WireError::BadLength(len.into()));
    }
    if as_usize > max {
        return Err(WireError::TooLarge { len: as_usize, max });
    }
    Ok(as_usize)
}

/// The header of a tagged message: its type byte and its length word (which counts itself
/// but not the tag), as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message type byte.
    pub tag: u8,
    /// The length word, unchecked.
    pub len: i32,
}

impl FrameHeader {
    /// The header of the message at `offset` in `buf`, once its five bytes are there.
    #[inline]
    pub fn at(buf: &[u8], offset: usize) -> Option<Self> {
        let head: &[u8; HEADER_LEN] = buf.get(offset..)?.first_chunk()?;
        let [tag, len @ ..] = *head;
        Some(Self {
            tag,
            len: i32::from_be_bytes(len),
        })
    }
}

/// Where one whole tagged message lies in a buffer, as [`scan_frame`] found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameSpan {
    /// The message type byte.
    pub tag: u8,
    /// Offset of the tag byte.
    pub start: usize,
    /// Offset just past the message.
    pub end: usize,
}

impl FrameSpan {
    /// Where the body lies (after the length word).
    #[inline]
    pub fn body(&self) -> std::ops::Range<usize> {
        self.start + HEADER_LEN..self.end
    }

    /// Size of the whole message in bytes, tag included.
    #[inline]
    pub fn total_len(&self) -> usize {
        self.end - self.start
    }
}

/// A length word no message can have: below 4 (it counts itself), negative, or above the
/// maximum the reader accepts. Nothing after it in the stream can be framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadFrameLength {
    /// The message type byte.
    pub tag: u8,
    /// The length word as sent.
    pub len: i32,
    /// The largest length word the reader accepts.
    pub max: usize,
}

impl From<BadFrameLength> for WireError {
    fn from(bad: BadFrameLength) -> Self {
        match usize::try_from(bad.len) {
            Ok(len) if len >= 4 => WireError::TooLarge { len, max: bad.max },
            _ => WireError::BadLength(bad.len.into()),
        }
    }
}

/// Finds the tagged message at `offset` in `buf`: its place, once the whole of it is there.
///
/// `Ok(None)` while the header or the body is incomplete. The length word is checked as soon
/// as the header is in, before waiting for the body: below 4 or above `max_len` (which bounds
/// the length word, as in [`decode_frame`]) is an error. Nothing is copied or consumed.
#[inline]
pub fn scan_frame(
    buf: &[u8],
    offset: usize,
    max_len: usize,
) -> Result<Option<FrameSpan>, BadFrameLength> {
    let Some(FrameHeader { tag, len }) = FrameHeader::at(buf, offset) else {
        return Ok(None);
    };
    let body_and_word = match usize::try_from(len) {
        Ok(n) if (4..=max_len).contains(&n) => n,
        _ => {
            return Err(BadFrameLength {
                tag,
                len,
                max: max_len,
            })
        }
    };
    let end = offset.saturating_add(1 + body_and_word);
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some(FrameSpan {
        tag,
        start: offset,
        end,
    }))
}

/// Splits one tagged message off the front of `buf`.
///
/// Returns `Ok(None)` without consuming anything while the message is incomplete. The length
/// word is validated as soon as the header is in, before waiting for the body, so an oversized
/// or negative length fails immediately. `max_len` bounds the length word (which counts itself).
/// On success the message is split off without copying.
pub fn decode_frame(buf: &mut BytesMut, max_len: usize) -> Result<Option<Frame>, WireError> {
    let Some(span) = scan_frame(buf, 0, max_len)? else {
        return Ok(None);
    };
    Ok(Some(Frame {
        raw: buf.split_to(span.end).freeze(),
    }))
}

/// Bytes a read asks room for at the end of a read buffer.
pub const READ_ROOM: usize = 8192;

/// Makes room for a read at the end of `buf`, unless a little is there already: asking for
/// [`READ_ROOM`] when almost that much is free would move or reallocate the buffer for
/// nothing (a message left unread, such as one waiting for a slot, keeps its place).
pub fn room_for_read(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_ROOM / 8 {
        buf.reserve(READ_ROOM);
    }
}

/// A packet of the startup phase (sent before any tagged message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartupPacket {
    /// The client asks for TLS.
    SslRequest,
    /// The client asks for GSSAPI encryption.
    GssEncRequest,
    /// Cancel the query running on backend `pid`, proven by `secret` (4 bytes in protocol 3.0,
    /// up to 256 in 3.2).
    Cancel {
        /// Backend process id from BackendKeyData.
        pid: u32,
        /// Secret key from BackendKeyData.
        secret: Bytes,
    },
    /// A StartupMessage for protocol `major.minor` (major is always 3).
    Startup {
        /// Protocol major version.
        major: u16,
        /// Protocol minor version requested (the server may negotiate it down).
        minor: u16,
        /// Parameters in the order sent; always contains `user`.
        params: Vec<(String, String)>,
    },
}

/// Splits one startup-phase packet off the front of `buf` and decodes it.
///
/// Returns `Ok(None)` without consuming anything while incomplete. The packet length is
/// bounded by `min(max_len, 10000)` like PostgreSQL, and checked before waiting for the rest.
pub fn decode_startup(
    buf: &mut BytesMut,
    max_len: usize,
) -> Result<Option<StartupPacket>, WireError> {
    let Some(len) = peek_len(buf) else {
        return Ok(None);
    };
    let len = check_len(len, 8, max_len.min(MAX_STARTUP_PACKET_LEN))?;
    if buf.len() < len {
        return Ok(None);
    }
    let packet = buf.split_to(len).freeze();
    parse_startup(packet.slice(4..)).map(Some)
}

/// Decodes a startup packet body (request code onwards).
fn parse_startup(body: Bytes) -> Result<StartupPacket, WireError> {
    let mut r = Reader::new(body);
    let code = r.u32("invalid startup packet: missing protocol code")?;
    match code {
        SSL_REQUEST_CODE => exact_end(&r, StartupPacket::SslRequest),
        GSSENC_REQUEST_CODE => exact_end(&r, StartupPacket::GssEncRequest),
        CANCEL_REQUEST_CODE => parse_cancel(r),
        _ if code >> 16 == 3 => parse_params(r, code),
        _ => Err(WireError::UnsupportedProtocol(code)),
    }
}

fn exact_end(r: &Reader, packet: StartupPacket) -> Result<StartupPacket, WireError> {
    r.finish("invalid length of startup packet")?;
    Ok(packet)
}

fn parse_cancel(mut r: Reader) -> Result<StartupPacket, WireError> {
    let pid = r.u32("invalid length of cancel request packet")?;
    let secret = r.rest();
    if !(4..=MAX_CANCEL_SECRET_LEN).contains(&secret.len()) {
        return Err(WireError::Malformed(
            "invalid length of cancel request packet",
        ));
    }
    Ok(StartupPacket::Cancel { pid, secret })
}

fn parse_params(mut r: Reader, code: u32) -> Result<StartupPacket, WireError> {
    const LAYOUT: &str = "invalid startup packet layout: expected terminator as last byte";
    let mut params = Vec::new();
    loop {
        let key = r.cstr(LAYOUT)?;
        if key.is_empty() {
            break;
        }
        let value = r.cstr(LAYOUT)?;
        let key = String::from_utf8(key.to_vec()).map_err(|e| {
            WireError::NotUtf8Parameter(String::from_utf8_lossy(e.as_bytes()).into_owned())
        })?;
        let value = match String::from_utf8(value.to_vec()) {
            Ok(value) => value,
            // PostgreSQL keeps only printable ASCII of an application_name and writes the
            // rest as '?' (as releases before 16 do; 16 and later write \xNN).
            Err(e) if key == "application_name" => clean_ascii(e.as_bytes()),
            Err(_) => return Err(WireError::NotUtf8Parameter(key)),
        };
        params.push((key, value));
    }
    r.finish(LAYOUT)?;
    if !params.iter().any(|(k, _)| k == "user") {
        return Err(WireError::NoUser);
    }
    Ok(StartupPacket::Startup {
        major: 3,
        minor: (code & 0xffff) as u16,
        params,
    })
}

/// PostgreSQL's `pg_clean_ascii`: each byte outside printable ASCII becomes '?'.
fn clean_ascii(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            32..=126 => char::from(b),
            _ => '?',
        })
        .collect()
}

/// Re-encodes a startup packet (the inverse of [`decode_startup`]).
pub fn encode_startup_packet(buf: &mut BytesMut, packet: &StartupPacket) {
    use bytes::BufMut;
    put_untagged(buf, |b| match packet {
        StartupPacket::SslRequest => b.put_u32(SSL_REQUEST_CODE),
        StartupPacket::GssEncRequest => b.put_u32(GSSENC_REQUEST_CODE),
        StartupPacket::Cancel { pid, secret } => {
            b.put_u32(CANCEL_REQUEST_CODE);
            b.put_u32(*pid);
            b.put_slice(secret);
        }
        StartupPacket::Startup {
            major,
            minor,
            params,
        } => {
            b.put_u32((u32::from(*major) << 16) | u32::from(*minor));
            for (k, v) in params {
                super::codec::put_cstr(b, k.as_bytes());
                super::codec::put_cstr(b, v.as_bytes());
            }
            b.put_u8(0);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn startup_bytes(params: &[(&str, &str)], code: u32) -> BytesMut {
        let mut b = BytesMut::new();
        put_untagged(&mut b, |b| {
            b.put_u32(code);
            for (k, v) in params {
                b.put_slice(k.as_bytes());
                b.put_u8(0);
                b.put_slice(v.as_bytes());
                b.put_u8(0);
            }
            b.put_u8(0);
        });
        b
    }

    #[test]
    fn frame_waits_then_splits() {
        let mut buf = BytesMut::from(&b"Q\x00\x00\x00\x08sel"[..]);
        assert_eq!(decode_frame(&mut buf, 100).unwrap(), None);
        assert_eq!(buf.len(), 8);
        buf.put_slice(b"\0S\x00\x00\x00\x04");
        let f = decode_frame(&mut buf, 100).unwrap().unwrap();
        assert_eq!(f.tag(), b'Q');
        assert_eq!(&f.body()[..], b"sel\0");
        assert_eq!(f.len(), 9);
        let f = decode_frame(&mut buf, 100).unwrap().unwrap();
        assert_eq!(f.tag(), b'S');
        assert!(f.body().is_empty());
        assert!(buf.is_empty());
    }

    #[test]
    fn frame_rejects_bad_lengths_early() {
        let mut buf = BytesMut::from(&b"Q\x00\x00\x00\x03"[..]);
        assert_eq!(decode_frame(&mut buf, 100), Err(WireError::BadLength(3)));
        let mut buf = BytesMut::from(&b"Q\xff\xff\xff\xff"[..]);
        assert_eq!(decode_frame(&mut buf, 100), Err(WireError::BadLength(-1)));
        let mut buf = BytesMut::from(&b"Q\x00\x00\x01\x00"[..]);
        assert_eq!(
            decode_frame(&mut buf, 100),
            Err(WireError::TooLarge { len: 256, max: 100 })
        );
        assert_eq!(buf.len(), 5);
    }

    #[test]
    fn frame_from_raw_checks_length() {
        assert!(Frame::from_raw(Bytes::from_static(b"S\x00\x00\x00\x04")).is_ok());
        assert!(Frame::from_raw(Bytes::from_static(b"S\x00\x00\x00\x05")).is_err());
        assert!(Frame::from_raw(Bytes::from_static(b"S\x00\x00\x00\x04x")).is_err());
    }

    #[test]
    fn startup_message() {
        let mut buf = startup_bytes(&[("user", "bob"), ("database", "db")], PROTOCOL_3_0 | 2);
        let whole = buf.clone();
        let mut part = BytesMut::from(&whole[..whole.len() - 1]);
        assert_eq!(decode_startup(&mut part, 1 << 20).unwrap(), None);
        let p = decode_startup(&mut buf, 1 << 20).unwrap().unwrap();
        assert_eq!(
            p,
            StartupPacket::Startup {
                major: 3,
                minor: 2,
                params: vec![
                    ("user".into(), "bob".into()),
                    ("database".into(), "db".into())
                ],
            }
        );
        let mut again = BytesMut::new();
        encode_startup_packet(&mut again, &p);
        assert_eq!(again, whole);
    }

    #[test]
    fn startup_rejections() {
        let mut b = startup_bytes(&[("database", "db")], PROTOCOL_3_0);
        assert_eq!(decode_startup(&mut b, 1 << 20), Err(WireError::NoUser));
        let mut b = startup_bytes(&[("user", "x")], 2 << 16);
        assert_eq!(
            decode_startup(&mut b, 1 << 20),
            Err(WireError::UnsupportedProtocol(2 << 16))
        );
        let mut b = startup_bytes(&[("user", "\u{e9}")], PROTOCOL_3_0);
        if let Some(x) = b.iter().position(|&c| c == 0xc3) {
            b[x] = 0xff;
        }
        assert_eq!(
            decode_startup(&mut b, 1 << 20),
            Err(WireError::NotUtf8Parameter("user".into()))
        );
        let mut b = startup_bytes(&[("user", "x")], PROTOCOL_3_0);
        b.put_u8(7);
        let len = b.len() as u32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        assert!(matches!(
            decode_startup(&mut b, 1 << 20),
            Err(WireError::Malformed(_))
        ));
        let mut b = BytesMut::from(&b"\x00\x00\x27\x11"[..]);
        assert_eq!(
            decode_startup(&mut b, 1 << 20),
            Err(WireError::TooLarge {
                len: 10001,
                max: 10000
            })
        );
        let mut b = BytesMut::from(&b"\x00\x00\x00\x07"[..]);
        assert_eq!(
            decode_startup(&mut b, 1 << 20),
            Err(WireError::BadLength(7))
        );
    }

    #[test]
    fn a_latin1_application_name_is_cleaned_as_postgresql_cleans_it() {
        // "Müller" in Latin-1: the ü is one byte, 0xfc, not UTF-8.
        let mut b = startup_bytes(
            &[("user", "x"), ("application_name", "M_ller")],
            PROTOCOL_3_0,
        );
        let at = b.iter().rposition(|&c| c == b'_').expect("placeholder");
        b[at] = 0xfc;
        let Some(StartupPacket::Startup { params, .. }) = decode_startup(&mut b, 1 << 20).unwrap()
        else {
            panic!("not a startup packet");
        };
        assert_eq!(params[1], ("application_name".into(), "M?ller".into()));
    }

    #[test]
    fn special_requests() {
        for p in [
            StartupPacket::SslRequest,
            StartupPacket::GssEncRequest,
            StartupPacket::Cancel {
                pid: 42,
                secret: Bytes::from_static(b"\x01\x02\x03\x04"),
            },
            StartupPacket::Cancel {
                pid: 7,
                secret: Bytes::from(vec![9u8; 256]),
            },
        ] {
            let mut b = BytesMut::new();
            encode_startup_packet(&mut b, &p);
            assert_eq!(decode_startup(&mut b, 1 << 20).unwrap(), Some(p));
            assert!(b.is_empty());
        }
        let mut short = BytesMut::new();
        put_untagged(&mut short, |b| {
            b.put_u32(CANCEL_REQUEST_CODE);
            b.put_u32(1);
            b.put_u16(1);
        });
        assert!(decode_startup(&mut short, 1 << 20).is_err());
        let mut long_ssl = BytesMut::new();
        put_untagged(&mut long_ssl, |b| {
            b.put_u32(SSL_REQUEST_CODE);
            b.put_u32(1);
        });
        assert!(decode_startup(&mut long_ssl, 1 << 20).is_err());
    }
}
