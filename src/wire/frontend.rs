//! Messages sent by a client (frontend) to a server: typed decoding and encoders.

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{len_i16, len_i32, put_cstr, put_message, put_untagged, Reader};
use super::error::WireError;
use super::frame::{Frame, CANCEL_REQUEST_CODE, PROTOCOL_3_0, SSL_REQUEST_CODE};

/// Message type bytes a client sends. A server uses some of the same bytes for other
/// messages (`E` is Execute here, ErrorResponse there): see [`super::backend::tag`].
pub mod tag {
    /// Query.
    pub const QUERY: u8 = b'Q';
    /// Parse.
    pub const PARSE: u8 = b'P';
    /// Bind.
    pub const BIND: u8 = b'B';
    /// Describe.
    pub const DESCRIBE: u8 = b'D';
    /// Execute.
    pub const EXECUTE: u8 = b'E';
    /// Close.
    pub const CLOSE: u8 = b'C';
    /// Sync.
    pub const SYNC: u8 = b'S';
    /// Flush.
    pub const FLUSH: u8 = b'H';
    /// Terminate.
    pub const TERMINATE: u8 = b'X';
    /// CopyData (a server sends it with the same byte).
    pub const COPY_DATA: u8 = b'd';
    /// CopyDone (a server sends it with the same byte).
    pub const COPY_DONE: u8 = b'c';
    /// CopyFail.
    pub const COPY_FAIL: u8 = b'f';
    /// FunctionCall.
    pub const FUNCTION_CALL: u8 = b'F';
    /// PasswordMessage, SASLInitialResponse, SASLResponse, GSSResponse.
    pub const PASSWORD: u8 = b'p';
}

/// What a Describe or Close names: the byte after its tag.
pub mod target {
    /// A prepared statement.
    pub const STATEMENT: u8 = b'S';
    /// A portal.
    pub const PORTAL: u8 = b'P';
}

mod views;

pub use views::{BindView, CloseView, DescribeView, ParamTypes, ParseView, Parsed, QueryView};

/// A client message, decoded only as far as a pooler needs. The full bytes stay in the
/// [`Frame`] for forwarding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frontend {
    /// Simple query; `sql` excludes the trailing NUL.
    Query {
        /// Query text.
        sql: Bytes,
    },
    /// Parse a prepared statement.
    Parse {
        /// Statement name (empty for the unnamed statement).
        name: Bytes,
        /// Query text.
        query: Bytes,
        /// Parameter type OIDs (0 = unspecified).
        param_types: Vec<u32>,
    },
    /// Bind; only the names are decoded.
    Bind {
        /// Destination portal name.
        portal: Bytes,
        /// Source statement name.
        statement: Bytes,
    },
    /// Describe a statement or portal.
    Describe {
        /// [`target::STATEMENT`] or [`target::PORTAL`].
        kind: u8,
        /// Object name.
        name: Bytes,
    },
    /// Execute a portal.
    Execute {
        /// Portal name.
        portal: Bytes,
        /// Row limit as sent (0 means no limit; PostgreSQL also treats negative values, seen
        /// here as large numbers, as no limit).
        max_rows: u32,
    },
    /// Close a statement or portal.
    Close {
        /// [`target::STATEMENT`] or [`target::PORTAL`].
        kind: u8,
        /// Object name.
        name: Bytes,
    },
    /// Sync.
    Sync,
    /// Flush.
    Flush,
    /// Terminate.
    Terminate,
    /// CopyData (content left in the frame).
    CopyData,
    /// CopyDone.
    CopyDone,
    /// CopyFail with the client's reason.
    CopyFail {
        /// Reason text, without NUL.
        message: Bytes,
    },
    /// FunctionCall (content left in the frame).
    FunctionCall,
    /// PasswordMessage, SASLInitialResponse or SASLResponse: which one depends on what the
    /// server asked; see [`parse_password`] and [`parse_sasl_initial`].
    Password,
    /// A tag this codec does not know.
    Unknown(u8),
}

/// Decodes a client message.
pub fn decode_frontend(frame: &Frame) -> Result<Frontend, WireError> {
    let body = frame.body();
    let mut r = Reader::new(body.clone());
    let msg = match frame.tag() {
        tag::QUERY => decode_query(&body)?,
        tag::PARSE => {
            let view = ParseView::new(&body)?;
            Frontend::Parse {
                name: body.slice_ref(view.name),
                query: body.slice_ref(view.query),
                param_types: view.param_types()?.iter().collect(),
            }
        }
        tag::BIND => {
            let view = BindView::new(&body)?;
            Frontend::Bind {
                portal: body.slice_ref(view.portal),
                statement: body.slice_ref(view.statement),
            }
        }
        tag::DESCRIBE => {
            let (kind, name) = decode_target(&body, "invalid DESCRIBE message subtype")?;
            Frontend::Describe { kind, name }
        }
        tag::EXECUTE => decode_execute(&mut r)?,
        tag::CLOSE => {
            let (kind, name) = decode_target(&body, "invalid CLOSE message subtype")?;
            Frontend::Close { kind, name }
        }
        tag::SYNC => empty(&r, Frontend::Sync, "invalid Sync message format")?,
        tag::FLUSH => empty(&r, Frontend::Flush, "invalid Flush message format")?,
        tag::TERMINATE => Frontend::Terminate,
        tag::COPY_DATA => Frontend::CopyData,
        tag::COPY_DONE => Frontend::CopyDone,
        tag::COPY_FAIL => Frontend::CopyFail {
            message: r.cstr("invalid CopyFail message: missing terminator")?,
        },
        tag::FUNCTION_CALL => Frontend::FunctionCall,
        tag::PASSWORD => Frontend::Password,
        other => Frontend::Unknown(other),
    };
    Ok(msg)
}

fn empty(r: &Reader, msg: Frontend, what: &'static str) -> Result<Frontend, WireError> {
    r.finish(what)?;
    Ok(msg)
}

/// The text of a Query whose only NUL ends it.
fn decode_query(body: &Bytes) -> Result<Frontend, WireError> {
    const WHAT: &str = "invalid Query message: text must end with its only NUL byte";
    let view = QueryView::new(body);
    if body.last() != Some(&0) || memchr::memchr(0, view.text).is_some() {
        return Err(WireError::Malformed(WHAT));
    }
    Ok(Frontend::Query {
        sql: body.slice_ref(view.text),
    })
}

/// The target of a Describe or Close whose name's NUL ends it.
fn decode_target(body: &Bytes, what: &'static str) -> Result<(u8, Bytes), WireError> {
    let view = CloseView::new(body).map_err(|_| WireError::Malformed(what))?;
    if body.len() != 1 + view.name.len() + 1 {
        return Err(WireError::Malformed(what));
    }
    Ok((view.kind, body.slice_ref(view.name)))
}

fn decode_execute(r: &mut Reader) -> Result<Frontend, WireError> {
    const WHAT: &str = "invalid Execute message format";
    let portal = r.cstr(WHAT)?;
    let max_rows = r.u32(WHAT)?;
    r.finish(WHAT)?;
    Ok(Frontend::Execute { portal, max_rows })
}

/// Decodes a PasswordMessage body: the password without its NUL. The NUL must be the last
/// byte and the only one.
pub fn parse_password(body: &[u8]) -> Result<Bytes, WireError> {
    const WHAT: &str = "invalid password packet size";
    let mut r = Reader::from_slice(body);
    let pw = r.cstr(WHAT)?;
    r.finish(WHAT)?;
    Ok(pw)
}

/// Decodes a SASLInitialResponse body: the mechanism name and the initial client data (empty
/// when the client sent none, length -1).
pub fn parse_sasl_initial(body: &[u8]) -> Result<(String, Bytes), WireError> {
    const WHAT: &str = "invalid SASLInitialResponse message format";
    let mut r = Reader::from_slice(body);
    let mechanism = r.cstr_utf8(WHAT)?;
    let len = r.i32(WHAT)?;
    let data = match usize::try_from(len) {
        Ok(n) => r.take(n, WHAT)?,
        Err(_) if len == -1 => Bytes::new(),
        Err(_) => return Err(WireError::Malformed(WHAT)),
    };
    r.finish(WHAT)?;
    Ok((mechanism, data))
}

/// Query: simple-protocol query text.
pub fn encode_query(buf: &mut BytesMut, sql: &str) {
    put_message(buf, tag::QUERY, |b| put_cstr(b, sql.as_bytes()));
}

/// Sync.
pub fn encode_sync(buf: &mut BytesMut) {
    put_message(buf, tag::SYNC, |_| {});
}

/// Flush.
pub fn encode_flush(buf: &mut BytesMut) {
    put_message(buf, tag::FLUSH, |_| {});
}

/// Terminate.
pub fn encode_terminate(buf: &mut BytesMut) {
    put_message(buf, tag::TERMINATE, |_| {});
}

/// Parse: prepare `query` as statement `name` with the given parameter type OIDs.
pub fn encode_parse(buf: &mut BytesMut, name: &[u8], query: &[u8], param_types: &[u32]) {
    put_message(buf, tag::PARSE, |b| {
        put_cstr(b, name);
        put_cstr(b, query);
        b.put_i16(len_i16(param_types.len()));
        for oid in param_types.iter().take(i16::MAX as usize) {
            b.put_u32(*oid);
        }
    });
}

/// Close a statement or portal ([`target::STATEMENT`] or [`target::PORTAL`]).
pub fn encode_close(buf: &mut BytesMut, kind: u8, name: &[u8]) {
    put_message(buf, tag::CLOSE, |b| {
        b.put_u8(kind);
        put_cstr(b, name);
    });
}

/// Describe a statement or portal ([`target::STATEMENT`] or [`target::PORTAL`]).
pub fn encode_describe(buf: &mut BytesMut, kind: u8, name: &[u8]) {
    put_message(buf, tag::DESCRIBE, |b| {
        b.put_u8(kind);
        put_cstr(b, name);
    });
}

/// Parse with the parameter types written as given: `raw_types` is the Int16 count and the
/// OIDs, as a client's Parse carries them after the query text.
pub fn encode_parse_raw(buf: &mut BytesMut, name: &[u8], query: &[u8], raw_types: &[u8]) {
    put_message(buf, tag::PARSE, |b| {
        put_cstr(b, name);
        put_cstr(b, query);
        b.put_slice(raw_types);
    });
}

/// Bind `statement` to `portal`. `params` are the parameter format codes and values as a
/// Bind carries them (see [`bind_params`]); `result_formats` the format code of each result
/// column (none: all text).
pub fn encode_bind(
    buf: &mut BytesMut,
    portal: &[u8],
    statement: &[u8],
    params: &[u8],
    result_formats: &[i16],
) {
    put_message(buf, tag::BIND, |b| {
        put_cstr(b, portal);
        put_cstr(b, statement);
        b.put_slice(params);
        put_formats(b, result_formats);
    });
}

/// Bind `statement` to `portal` with every parameter and every result column in text
/// format.
pub fn encode_bind_text(buf: &mut BytesMut, portal: &[u8], statement: &[u8], values: &[&[u8]]) {
    put_message(buf, tag::BIND, |b| {
        put_cstr(b, portal);
        put_cstr(b, statement);
        put_formats(b, &[]);
        b.put_i16(len_i16(values.len()));
        for v in values.iter().take(i16::MAX as usize) {
            b.put_i32(len_i32(v.len()));
            b.put_slice(v);
        }
        put_formats(b, &[]);
    });
}

/// A list of format codes: its Int16 count, then the codes.
fn put_formats(b: &mut BytesMut, formats: &[i16]) {
    b.put_i16(len_i16(formats.len()));
    for f in formats.iter().take(i16::MAX as usize) {
        b.put_i16(*f);
    }
}

/// Execute `portal`, returning at most `max_rows` rows (0: all of them).
pub fn encode_execute(buf: &mut BytesMut, portal: &[u8], max_rows: u32) {
    put_message(buf, tag::EXECUTE, |b| {
        put_cstr(b, portal);
        b.put_u32(max_rows);
    });
}

/// The parameter format codes and values at the front of `rest`, what follows the statement
/// name in a Bind, without the result format codes that end it: an error when `rest` is
/// shorter than its counts say.
pub fn bind_params(rest: &[u8]) -> Result<&[u8], WireError> {
    const WHAT: &str = "invalid Bind message: parameters cut short";
    let bad = || WireError::Malformed(WHAT);
    let (formats, after) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
    let after = after
        .get(usize::from(u16::from_be_bytes(*formats)) * 2..)
        .ok_or_else(bad)?;
    let (count, mut values) = after.split_first_chunk::<2>().ok_or_else(bad)?;
    for _ in 0..u16::from_be_bytes(*count) {
        let (len, after) = values.split_first_chunk::<4>().ok_or_else(bad)?;
        values = match usize::try_from(i32::from_be_bytes(*len)) {
            Ok(n) => after.get(n..).ok_or_else(bad)?,
            Err(_) => after, // NULL
        };
    }
    Ok(&rest[..rest.len() - values.len()])
}

/// StartupMessage for protocol 3.0 with the given parameters.
pub fn encode_startup(buf: &mut BytesMut, params: &[(&str, &str)]) {
    put_untagged(buf, |b| {
        b.put_u32(PROTOCOL_3_0);
        for (k, v) in params {
            put_cstr(b, k.as_bytes());
            put_cstr(b, v.as_bytes());
        }
        b.put_u8(0);
    });
}

/// CancelRequest for backend `pid` with its secret key.
pub fn encode_cancel_request(buf: &mut BytesMut, pid: u32, secret: &[u8]) {
    put_untagged(buf, |b| {
        b.put_u32(CANCEL_REQUEST_CODE);
        b.put_u32(pid);
        b.put_slice(secret);
    });
}

/// SSLRequest.
pub fn encode_ssl_request(buf: &mut BytesMut) {
    put_untagged(buf, |b| b.put_u32(SSL_REQUEST_CODE));
}

/// PasswordMessage (cleartext or MD5 response), NUL-terminated.
pub fn encode_password(buf: &mut BytesMut, password: &[u8]) {
    put_message(buf, tag::PASSWORD, |b| put_cstr(b, password));
}

/// SASLInitialResponse: chosen mechanism and the client-first-message.
pub fn encode_sasl_initial(buf: &mut BytesMut, mechanism: &str, data: &[u8]) {
    put_message(buf, tag::PASSWORD, |b| {
        put_cstr(b, mechanism.as_bytes());
        b.put_i32(len_i32(data.len()));
        b.put_slice(data);
    });
}

/// SASLResponse: a continuation message of the SASL exchange.
pub fn encode_sasl_response(buf: &mut BytesMut, data: &[u8]) {
    put_message(buf, tag::PASSWORD, |b| b.put_slice(data));
}

#[cfg(test)]
mod tests {
    use super::super::frame::{decode_frame, decode_startup, StartupPacket};
    use super::*;

    fn one(buf: &mut BytesMut) -> Frame {
        let f = decode_frame(buf, 1 << 20).unwrap().unwrap();
        assert!(buf.is_empty());
        f
    }

    fn roundtrip(encode: impl FnOnce(&mut BytesMut)) -> Frontend {
        let mut b = BytesMut::new();
        encode(&mut b);
        decode_frontend(&one(&mut b)).unwrap()
    }

    #[test]
    fn encoders_roundtrip() {
        assert_eq!(
            roundtrip(|b| encode_query(b, "select 1")),
            Frontend::Query {
                sql: Bytes::from_static(b"select 1")
            }
        );
        assert_eq!(roundtrip(encode_sync), Frontend::Sync);
        assert_eq!(roundtrip(encode_flush), Frontend::Flush);
        assert_eq!(roundtrip(encode_terminate), Frontend::Terminate);
        assert_eq!(
            roundtrip(|b| encode_parse(b, b"s1", b"select $1", &[23, 0])),
            Frontend::Parse {
                name: Bytes::from_static(b"s1"),
                query: Bytes::from_static(b"select $1"),
                param_types: vec![23, 0],
            }
        );
        assert_eq!(
            roundtrip(|b| encode_close(b, b'S', b"s1")),
            Frontend::Close {
                kind: b'S',
                name: Bytes::from_static(b"s1")
            }
        );
        assert_eq!(
            roundtrip(|b| encode_describe(b, b'P', b"")),
            Frontend::Describe {
                kind: b'P',
                name: Bytes::new()
            }
        );
    }

    #[test]
    fn extended_encoders() {
        assert_eq!(
            roundtrip(|b| encode_bind(b, b"p", b"s", b"\0\0\0\0", &[1])),
            Frontend::Bind {
                portal: Bytes::from_static(b"p"),
                statement: Bytes::from_static(b"s")
            }
        );
        assert_eq!(
            roundtrip(|b| encode_execute(b, b"p", 7)),
            Frontend::Execute {
                portal: Bytes::from_static(b"p"),
                max_rows: 7
            }
        );
        let mut b = BytesMut::new();
        encode_bind(&mut b, b"p", b"s", b"\0\0\0\0", &[1]);
        assert_eq!(&b[..], b"B\0\0\0\x10p\0s\0\0\0\0\0\0\x01\0\x01");
        let mut b = BytesMut::new();
        encode_bind_text(&mut b, b"", b"", &[b"bob"]);
        assert_eq!(&b[..], b"B\0\0\0\x13\0\0\0\0\0\x01\0\0\0\x03bob\0\0");
        let (mut raw, mut typed) = (BytesMut::new(), BytesMut::new());
        encode_parse_raw(&mut raw, b"s", b"q", b"\0\x02\0\0\0\x17\0\0\0\0");
        encode_parse(&mut typed, b"s", b"q", &[23, 0]);
        assert_eq!(raw, typed);
    }

    #[test]
    fn bind_params_stop_before_result_formats() {
        // One format (text), two values ("ab", NULL), one result format (binary).
        let rest = [
            0, 1, 0, 0, 0, 2, 0, 0, 0, 2, b'a', b'b', 0xff, 0xff, 0xff, 0xff, 0, 1, 0, 1,
        ];
        assert_eq!(bind_params(&rest), Ok(&rest[..16]));
        assert!(bind_params(&rest[..11]).is_err());
        assert!(bind_params(&[0, 5]).is_err());
        assert!(bind_params(&[]).is_err());
    }

    #[test]
    fn password_messages_roundtrip() {
        let mut b = BytesMut::new();
        encode_password(&mut b, b"secret");
        let f = one(&mut b);
        assert_eq!(decode_frontend(&f).unwrap(), Frontend::Password);
        assert_eq!(
            parse_password(&f.body()).unwrap(),
            Bytes::from_static(b"secret")
        );

        encode_sasl_initial(&mut b, "SCRAM-SHA-256", b"n,,n=,r=abc");
        let f = one(&mut b);
        let (mech, data) = parse_sasl_initial(&f.body()).unwrap();
        assert_eq!(mech, "SCRAM-SHA-256");
        assert_eq!(&data[..], b"n,,n=,r=abc");

        encode_sasl_response(&mut b, b"c=biws");
        assert_eq!(&one(&mut b).body()[..], b"c=biws");
    }

    #[test]
    fn password_rejections() {
        assert!(parse_password(b"a\0b\0").is_err());
        assert!(parse_password(b"ab").is_err());
        assert!(parse_sasl_initial(b"M\0\x00\x00\x00\x05abc").is_err());
        assert!(parse_sasl_initial(b"M\0\x00\x00\x00\x01ab").is_err());
        assert!(parse_sasl_initial(b"M\0\xff\xff\xff\xfe").is_err());
        assert_eq!(
            parse_sasl_initial(b"M\0\xff\xff\xff\xff").unwrap(),
            ("M".to_string(), Bytes::new())
        );
    }

    #[test]
    fn startup_encoders_roundtrip() {
        let mut b = BytesMut::new();
        encode_startup(&mut b, &[("user", "u"), ("database", "d")]);
        encode_cancel_request(&mut b, 5, b"abcd");
        encode_ssl_request(&mut b);
        assert_eq!(
            decode_startup(&mut b, 1 << 20).unwrap(),
            Some(StartupPacket::Startup {
                major: 3,
                minor: 0,
                params: vec![("user".into(), "u".into()), ("database".into(), "d".into())],
            })
        );
        assert_eq!(
            decode_startup(&mut b, 1 << 20).unwrap(),
            Some(StartupPacket::Cancel {
                pid: 5,
                secret: Bytes::from_static(b"abcd")
            })
        );
        assert_eq!(
            decode_startup(&mut b, 1 << 20).unwrap(),
            Some(StartupPacket::SslRequest)
        );
    }

    fn frame(tag: u8, body: &[u8]) -> Frame {
        let mut b = BytesMut::new();
        put_message(&mut b, tag, |b| b.put_slice(body));
        one(&mut b)
    }

    #[test]
    fn typed_decoding() {
        let f = frame(b'B', b"p1\0s1\0\x00\x00rest");
        assert_eq!(
            decode_frontend(&f).unwrap(),
            Frontend::Bind {
                portal: Bytes::from_static(b"p1"),
                statement: Bytes::from_static(b"s1")
            }
        );
        let f = frame(b'E', b"\0\x00\x00\x00\x0a");
        assert_eq!(
            decode_frontend(&f).unwrap(),
            Frontend::Execute {
                portal: Bytes::new(),
                max_rows: 10
            }
        );
        let f = frame(b'f', b"oops\0");
        assert_eq!(
            decode_frontend(&f).unwrap(),
            Frontend::CopyFail {
                message: Bytes::from_static(b"oops")
            }
        );
        for (tag, want) in [
            (b'd', Frontend::CopyData),
            (b'c', Frontend::CopyDone),
            (b'F', Frontend::FunctionCall),
            (b'X', Frontend::Terminate),
            (b'z', Frontend::Unknown(b'z')),
        ] {
            assert_eq!(decode_frontend(&frame(tag, b"")).unwrap(), want);
        }
    }

    #[test]
    fn typed_rejections() {
        for (tag, body) in [
            (b'Q', &b"select 1"[..]),
            (b'Q', b"a\0b\0"),
            (b'P', b"\0q\0\x00\x01"),
            (b'P', b"\0q\0\xff\xff"),
            (b'D', b"X\0"),
            (b'C', b"S"),
            (b'E', b"\0\x00"),
            (b'S', b"x"),
            (b'H', b"x"),
            (b'B', b"p"),
        ] {
            assert!(
                decode_frontend(&frame(tag, body)).is_err(),
                "{}",
                tag as char
            );
        }
    }
}
