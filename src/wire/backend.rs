//! Messages sent by a server (backend) to a client: typed decoding and encoders.
//!
//! Decoding runs on the hot path, so result-set messages (DataRow, RowDescription...) are only
//! recognised by their tag; their bytes stay in the [`Frame`] for forwarding.

use bytes::{BufMut, Bytes, BytesMut};

use std::borrow::Cow;

use super::codec::{len_i16, len_i32, put_cstr, put_message, Reader};
use super::error::WireError;
use super::frame::{Frame, PROTOCOL_3_0};

/// Message type bytes a server sends. A client uses some of the same bytes for other
/// messages (`E` is ErrorResponse here, Execute there): see [`super::frontend::tag`].
pub mod tag {
    /// Authentication* (Ok, the password and SASL requests).
    pub const AUTHENTICATION: u8 = b'R';
    /// ParameterStatus.
    pub const PARAMETER_STATUS: u8 = b'S';
    /// BackendKeyData.
    pub const BACKEND_KEY_DATA: u8 = b'K';
    /// ReadyForQuery.
    pub const READY_FOR_QUERY: u8 = b'Z';
    /// ErrorResponse.
    pub const ERROR_RESPONSE: u8 = b'E';
    /// NoticeResponse.
    pub const NOTICE_RESPONSE: u8 = b'N';
    /// CommandComplete.
    pub const COMMAND_COMPLETE: u8 = b'C';
    /// ParseComplete.
    pub const PARSE_COMPLETE: u8 = b'1';
    /// BindComplete.
    pub const BIND_COMPLETE: u8 = b'2';
    /// CloseComplete.
    pub const CLOSE_COMPLETE: u8 = b'3';
    /// NoData.
    pub const NO_DATA: u8 = b'n';
    /// EmptyQueryResponse.
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    /// PortalSuspended.
    pub const PORTAL_SUSPENDED: u8 = b's';
    /// CopyInResponse.
    pub const COPY_IN_RESPONSE: u8 = b'G';
    /// CopyOutResponse.
    pub const COPY_OUT_RESPONSE: u8 = b'H';
    /// CopyBothResponse.
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    /// CopyData (a client sends it with the same byte).
    pub const COPY_DATA: u8 = b'd';
    /// CopyDone (a client sends it with the same byte).
    pub const COPY_DONE: u8 = b'c';
    /// DataRow.
    pub const DATA_ROW: u8 = b'D';
    /// RowDescription.
    pub const ROW_DESCRIPTION: u8 = b'T';
    /// ParameterDescription.
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    /// NotificationResponse.
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    /// NegotiateProtocolVersion.
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
    /// FunctionCallResponse.
    pub const FUNCTION_CALL_RESPONSE: u8 = b'V';
}

/// A whole ParseComplete message, for an answer pgward gives without encoding one.
pub const PARSE_COMPLETE_MESSAGE: &[u8] = &[tag::PARSE_COMPLETE, 0, 0, 0, 4];
/// A whole CloseComplete message, for an answer pgward gives without encoding one.
pub const CLOSE_COMPLETE_MESSAGE: &[u8] = &[tag::CLOSE_COMPLETE, 0, 0, 0, 4];

/// Field type bytes of an ErrorResponse or NoticeResponse.
pub mod field {
    /// Severity, possibly localized.
    pub const SEVERITY: u8 = b'S';
    /// Severity, never localized.
    pub const SEVERITY_NONLOCALIZED: u8 = b'V';
    /// SQLSTATE code.
    pub const CODE: u8 = b'C';
    /// Primary message.
    pub const MESSAGE: u8 = b'M';
    /// Detail.
    pub const DETAIL: u8 = b'D';
    /// Hint.
    pub const HINT: u8 = b'H';
    /// Cursor position in the query string.
    pub const POSITION: u8 = b'P';
    /// Cursor position in an internally generated query.
    pub const INTERNAL_POSITION: u8 = b'p';
    /// The internally generated query.
    pub const INTERNAL_QUERY: u8 = b'q';
    /// The source file of PostgreSQL that raised it.
    pub const FILE: u8 = b'F';
    /// Its line there.
    pub const LINE: u8 = b'L';
    /// Its routine there.
    pub const ROUTINE: u8 = b'R';
}

const AUTH_OK: i32 = 0;
const AUTH_CLEARTEXT: i32 = 3;
const AUTH_MD5: i32 = 5;
const AUTH_SASL: i32 = 10;
const AUTH_SASL_CONTINUE: i32 = 11;
const AUTH_SASL_FINAL: i32 = 12;
/// OID of the `text` type.
const TEXT_OID: u32 = 25;

/// A server message, decoded only as far as a pooler needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// An Authentication* message.
    Auth(AuthRequest),
    /// A run-time parameter's current value.
    ParameterStatus {
        /// Parameter name.
        name: String,
        /// Parameter value.
        value: String,
    },
    /// Cancellation key of the backend.
    BackendKeyData {
        /// Backend process id.
        pid: u32,
        /// Secret key (4 bytes in protocol 3.0, up to 256 in 3.2).
        secret: Bytes,
    },
    /// The server is ready for a new query.
    ReadyForQuery(TxStatus),
    /// ErrorResponse.
    ErrorResponse(ErrorFields),
    /// NoticeResponse.
    NoticeResponse(ErrorFields),
    /// CommandComplete with its tag (e.g. `SELECT 1`), without NUL.
    CommandComplete {
        /// Command tag.
        tag: Bytes,
    },
    /// ParseComplete.
    ParseComplete,
    /// BindComplete.
    BindComplete,
    /// CloseComplete.
    CloseComplete,
    /// NoData.
    NoData,
    /// EmptyQueryResponse.
    EmptyQueryResponse,
    /// PortalSuspended.
    PortalSuspended,
    /// CopyInResponse.
    CopyInResponse,
    /// CopyOutResponse.
    CopyOutResponse,
    /// CopyBothResponse.
    CopyBothResponse,
    /// CopyData.
    CopyData,
    /// CopyDone.
    CopyDone,
    /// DataRow.
    DataRow,
    /// RowDescription.
    RowDescription,
    /// ParameterDescription.
    ParameterDescription,
    /// NotificationResponse.
    NotificationResponse,
    /// NegotiateProtocolVersion.
    NegotiateProtocolVersion,
    /// FunctionCallResponse.
    FunctionCallResponse,
    /// A tag this codec does not know.
    Unknown(u8),
}

/// What an Authentication message asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthRequest {
    /// Authentication succeeded.
    Ok,
    /// Send the password in clear.
    CleartextPassword,
    /// Send an MD5 response with this salt.
    Md5Password {
        /// Salt for the response.
        salt: [u8; 4],
    },
    /// Start SASL with one of these mechanisms.
    Sasl {
        /// Mechanisms offered, in server order.
        mechanisms: Vec<String>,
    },
    /// A SASL challenge (server-first-message for SCRAM).
    SaslContinue {
        /// Challenge data.
        data: Bytes,
    },
    /// SASL outcome data (server-final-message for SCRAM).
    SaslFinal {
        /// Outcome data.
        data: Bytes,
    },
    /// Any other method (Kerberos, GSS, SSPI...), by code.
    Other(u32),
}

/// Transaction status reported by ReadyForQuery.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TxStatus {
    /// Not in a transaction block (`I`).
    Idle,
    /// In a transaction block (`T`).
    InTransaction,
    /// In a failed transaction block (`E`).
    Failed,
}

impl TxStatus {
    /// Parses the status byte of ReadyForQuery.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'I' => Some(Self::Idle),
            b'T' => Some(Self::InTransaction),
            b'E' => Some(Self::Failed),
            _ => None,
        }
    }

    /// The status byte of ReadyForQuery.
    pub fn as_byte(self) -> u8 {
        match self {
            Self::Idle => b'I',
            Self::InTransaction => b'T',
            Self::Failed => b'E',
        }
    }
}

/// Fields of an ErrorResponse or NoticeResponse, as (field type byte, value) pairs in order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ErrorFields {
    /// Field type byte (`S`, `V`, `C`, `M`, `D`, `H`, ...) and its value.
    pub fields: Vec<(u8, String)>,
}

impl ErrorFields {
    /// Parses an ErrorResponse/NoticeResponse body. Values not in UTF-8 (a client encoding
    /// other than UTF8) are converted lossily; the raw frame is what gets forwarded.
    pub fn parse(body: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "invalid error or notice message: missing terminator";
        let mut r = Reader::from_slice(body);
        let mut fields = Vec::new();
        loop {
            let kind = r.u8(WHAT)?;
            if kind == 0 {
                break;
            }
            let value = r.cstr(WHAT)?;
            fields.push((kind, String::from_utf8_lossy(&value).into_owned()));
        }
        r.finish(WHAT)?;
        Ok(Self { fields })
    }

    /// The value of the first field of type `kind` in an ErrorResponse or NoticeResponse
    /// `body`, read in place: no allocation, and nothing else of the body is checked.
    pub fn find(body: &[u8], kind: u8) -> Option<&[u8]> {
        body.split(|b| *b == 0)
            .find(|f| f.first() == Some(&kind))
            .and_then(|f| f.get(1..))
    }

    /// First value of the given field type.
    pub fn get(&self, kind: u8) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, v)| v.as_str())
    }

    /// Non-localized severity (`V`), else the possibly localized one (`S`).
    pub fn severity(&self) -> Option<&str> {
        self.get(field::SEVERITY_NONLOCALIZED)
            .or_else(|| self.get(field::SEVERITY))
    }

    /// SQLSTATE code (`C`).
    pub fn code(&self) -> Option<&str> {
        self.get(field::CODE)
    }

    /// Primary message (`M`).
    pub fn message(&self) -> Option<&str> {
        self.get(field::MESSAGE)
    }

    /// The SQLSTATE, or XX000 when the server sent none.
    pub fn sqlstate(&self) -> &str {
        self.code().unwrap_or(super::sqlstate::INTERNAL_ERROR)
    }

    /// The primary message, or an empty string.
    pub fn text(&self) -> &str {
        self.message().unwrap_or("")
    }

    /// The same error as a FATAL of pgward's own, keeping code, message, detail and hint.
    pub fn to_fatal(&self) -> ErrorResponse {
        let mut e = ErrorResponse::fatal(self.sqlstate().to_string(), self.text());
        e.detail = self.get(field::DETAIL).map(str::to_string);
        e.hint = self.get(field::HINT).map(str::to_string);
        e
    }
}

/// Decodes a server message.
pub fn decode_backend(frame: &Frame) -> Result<Backend, WireError> {
    let msg = match frame.tag() {
        tag::AUTHENTICATION => Backend::Auth(decode_auth(frame.body())?),
        tag::PARAMETER_STATUS => decode_parameter_status(frame.body())?,
        tag::BACKEND_KEY_DATA => decode_key_data(frame.body())?,
        tag::READY_FOR_QUERY => decode_ready(frame.body())?,
        tag::ERROR_RESPONSE => Backend::ErrorResponse(ErrorFields::parse(&frame.body())?),
        tag::NOTICE_RESPONSE => Backend::NoticeResponse(ErrorFields::parse(&frame.body())?),
        tag::COMMAND_COMPLETE => Backend::CommandComplete {
            tag: Reader::new(frame.body()).cstr("invalid CommandComplete message")?,
        },
        other => decode_by_tag(other),
    };
    Ok(msg)
}

/// Messages recognised by tag alone.
fn decode_by_tag(tag: u8) -> Backend {
    match tag {
        tag::PARSE_COMPLETE => Backend::ParseComplete,
        tag::BIND_COMPLETE => Backend::BindComplete,
        tag::CLOSE_COMPLETE => Backend::CloseComplete,
        tag::NO_DATA => Backend::NoData,
        tag::EMPTY_QUERY_RESPONSE => Backend::EmptyQueryResponse,
        tag::PORTAL_SUSPENDED => Backend::PortalSuspended,
        tag::COPY_IN_RESPONSE => Backend::CopyInResponse,
        tag::COPY_OUT_RESPONSE => Backend::CopyOutResponse,
        tag::COPY_BOTH_RESPONSE => Backend::CopyBothResponse,
        tag::COPY_DATA => Backend::CopyData,
        tag::COPY_DONE => Backend::CopyDone,
        tag::DATA_ROW => Backend::DataRow,
        tag::ROW_DESCRIPTION => Backend::RowDescription,
        tag::PARAMETER_DESCRIPTION => Backend::ParameterDescription,
        tag::NOTIFICATION_RESPONSE => Backend::NotificationResponse,
        tag::NEGOTIATE_PROTOCOL_VERSION => Backend::NegotiateProtocolVersion,
        tag::FUNCTION_CALL_RESPONSE => Backend::FunctionCallResponse,
        other => Backend::Unknown(other),
    }
}

fn decode_auth(body: Bytes) -> Result<AuthRequest, WireError> {
    const WHAT: &str = "invalid authentication request from server";
    let mut r = Reader::new(body);
    let code = r.i32(WHAT)?;
    let req = match code {
        AUTH_OK => AuthRequest::Ok,
        AUTH_CLEARTEXT => AuthRequest::CleartextPassword,
        AUTH_MD5 => {
            let mut salt = [0u8; 4];
            salt.copy_from_slice(&r.take(4, WHAT)?);
            AuthRequest::Md5Password { salt }
        }
        AUTH_SASL => AuthRequest::Sasl {
            mechanisms: decode_mechanisms(&mut r)?,
        },
        AUTH_SASL_CONTINUE => AuthRequest::SaslContinue { data: r.rest() },
        AUTH_SASL_FINAL => AuthRequest::SaslFinal { data: r.rest() },
        other => AuthRequest::Other(other as u32),
    };
    if !matches!(req, AuthRequest::Other(_)) {
        r.finish(WHAT)?;
    }
    Ok(req)
}

fn decode_mechanisms(r: &mut Reader) -> Result<Vec<String>, WireError> {
    const WHAT: &str = "invalid SASL mechanism list from server";
    let mut mechanisms = Vec::new();
    loop {
        let m = r.cstr_utf8(WHAT)?;
        if m.is_empty() {
            return Ok(mechanisms);
        }
        mechanisms.push(m);
    }
}

fn decode_parameter_status(body: Bytes) -> Result<Backend, WireError> {
    const WHAT: &str = "invalid ParameterStatus message";
    let mut r = Reader::new(body);
    let name = r.cstr_utf8(WHAT)?;
    let value = r.cstr_utf8(WHAT)?;
    r.finish(WHAT)?;
    Ok(Backend::ParameterStatus { name, value })
}

fn decode_key_data(body: Bytes) -> Result<Backend, WireError> {
    const WHAT: &str = "invalid BackendKeyData message";
    let mut r = Reader::new(body);
    let pid = r.u32(WHAT)?;
    let secret = r.rest();
    if !(4..=super::frame::MAX_CANCEL_SECRET_LEN).contains(&secret.len()) {
        return Err(WireError::Malformed(WHAT));
    }
    Ok(Backend::BackendKeyData { pid, secret })
}

fn decode_ready(body: Bytes) -> Result<Backend, WireError> {
    const WHAT: &str = "invalid ReadyForQuery message";
    let mut r = Reader::new(body);
    let status = TxStatus::from_byte(r.u8(WHAT)?).ok_or(WireError::Malformed(WHAT))?;
    r.finish(WHAT)?;
    Ok(Backend::ReadyForQuery(status))
}

/// Severity of an error or notice we send.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Severity {
    /// ERROR: the current command fails.
    Error,
    /// FATAL: the session ends.
    Fatal,
    /// PANIC.
    Panic,
    /// WARNING.
    Warning,
    /// NOTICE.
    Notice,
    /// DEBUG.
    Debug,
    /// INFO.
    Info,
    /// LOG.
    Log,
}

impl Severity {
    /// The non-localized name sent in the `S` and `V` fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "ERROR",
            Self::Fatal => "FATAL",
            Self::Panic => "PANIC",
            Self::Warning => "WARNING",
            Self::Notice => "NOTICE",
            Self::Debug => "DEBUG",
            Self::Info => "INFO",
            Self::Log => "LOG",
        }
    }
}

/// An error or notice we generate ourselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorResponse {
    /// Severity.
    pub severity: Severity,
    /// SQLSTATE code (see [`super::sqlstate`]).
    pub code: Cow<'static, str>,
    /// Primary message.
    pub message: String,
    /// Optional detail.
    pub detail: Option<String>,
    /// Optional hint.
    pub hint: Option<String>,
}

impl ErrorResponse {
    /// A response with the given severity.
    pub fn new(
        severity: Severity,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            severity,
            code: code.into(),
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    /// An ERROR.
    pub fn error(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(Severity::Error, code, message)
    }

    /// A FATAL error (the connection is closed after it).
    pub fn fatal(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(Severity::Fatal, code, message)
    }

    /// Adds a DETAIL field.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds a HINT field.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    fn write_fields(&self, b: &mut BytesMut) {
        let severity = self.severity.as_str().as_bytes();
        let optional = [(field::DETAIL, &self.detail), (field::HINT, &self.hint)];
        let present = optional
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (*k, v.as_bytes())));
        let fields = [
            (field::SEVERITY, severity),
            (field::SEVERITY_NONLOCALIZED, severity),
            (field::CODE, self.code.as_bytes()),
            (field::MESSAGE, self.message.as_bytes()),
        ];
        for (kind, value) in fields.into_iter().chain(present) {
            b.put_u8(kind);
            put_cstr(b, value);
        }
        b.put_u8(0);
    }
}

/// ErrorResponse.
pub fn encode_error(buf: &mut BytesMut, err: &ErrorResponse) {
    put_message(buf, tag::ERROR_RESPONSE, |b| err.write_fields(b));
}

/// An ErrorResponse of the fields read from another, less the field types in `without`.
pub fn encode_error_fields(buf: &mut BytesMut, error: &ErrorFields, without: &[u8]) {
    put_message(buf, tag::ERROR_RESPONSE, |b| {
        for (kind, value) in error.fields.iter().filter(|(k, _)| !without.contains(k)) {
            b.put_u8(*kind);
            put_cstr(b, value.as_bytes());
        }
        b.put_u8(0);
    });
}

/// An ErrorResponse of the fields of another's `body`, read in place (in any encoding), each
/// passed through `reword` (its type and value): the value to send, or none to leave the
/// field out.
pub fn encode_error_reworded<'a>(
    buf: &mut BytesMut,
    body: &'a [u8],
    mut reword: impl FnMut(u8, &'a [u8]) -> Option<Cow<'a, [u8]>>,
) {
    put_message(buf, tag::ERROR_RESPONSE, |b| {
        for field in body.split(|c| *c == 0) {
            let Some((&kind, value)) = field.split_first() else {
                continue;
            };
            if let Some(value) = reword(kind, value) {
                b.put_u8(kind);
                put_cstr(b, &value);
            }
        }
        b.put_u8(0);
    });
}

/// NoticeResponse.
pub fn encode_notice(buf: &mut BytesMut, notice: &ErrorResponse) {
    put_message(buf, tag::NOTICE_RESPONSE, |b| notice.write_fields(b));
}

/// ReadyForQuery.
pub fn encode_ready_for_query(buf: &mut BytesMut, status: TxStatus) {
    put_message(buf, tag::READY_FOR_QUERY, |b| b.put_u8(status.as_byte()));
}

/// ParameterStatus.
pub fn encode_parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    put_message(buf, tag::PARAMETER_STATUS, |b| {
        put_cstr(b, name.as_bytes());
        put_cstr(b, value.as_bytes());
    });
}

/// BackendKeyData.
pub fn encode_backend_key_data(buf: &mut BytesMut, pid: u32, secret: &[u8]) {
    put_message(buf, tag::BACKEND_KEY_DATA, |b| {
        b.put_u32(pid);
        b.put_slice(secret);
    });
}

fn put_auth(buf: &mut BytesMut, code: i32, rest: impl FnOnce(&mut BytesMut)) {
    put_message(buf, tag::AUTHENTICATION, |b| {
        b.put_i32(code);
        rest(b);
    });
}

/// AuthenticationOk.
pub fn encode_auth_ok(buf: &mut BytesMut) {
    put_auth(buf, AUTH_OK, |_| {});
}

/// AuthenticationCleartextPassword.
pub fn encode_auth_cleartext(buf: &mut BytesMut) {
    put_auth(buf, AUTH_CLEARTEXT, |_| {});
}

/// AuthenticationMD5Password.
pub fn encode_auth_md5(buf: &mut BytesMut, salt: [u8; 4]) {
    put_auth(buf, AUTH_MD5, |b| b.put_slice(&salt));
}

/// AuthenticationSASL with the offered mechanisms.
pub fn encode_auth_sasl(buf: &mut BytesMut, mechanisms: &[&str]) {
    put_auth(buf, AUTH_SASL, |b| {
        for m in mechanisms {
            put_cstr(b, m.as_bytes());
        }
        b.put_u8(0);
    });
}

/// AuthenticationSASLContinue.
pub fn encode_auth_sasl_continue(buf: &mut BytesMut, data: &[u8]) {
    put_auth(buf, AUTH_SASL_CONTINUE, |b| b.put_slice(data));
}

/// AuthenticationSASLFinal.
pub fn encode_auth_sasl_final(buf: &mut BytesMut, data: &[u8]) {
    put_auth(buf, AUTH_SASL_FINAL, |b| b.put_slice(data));
}

/// NegotiateProtocolVersion: the newest 3.x minor version we support and the `_pq_.` options
/// we did not recognise. The version is sent as a full protocol code (3 << 16 | minor), as
/// PostgreSQL does.
pub fn encode_negotiate_protocol_version(
    buf: &mut BytesMut,
    newest_minor: u32,
    unrecognized_options: &[String],
) {
    put_message(buf, tag::NEGOTIATE_PROTOCOL_VERSION, |b| {
        b.put_u32(PROTOCOL_3_0 | (newest_minor & 0xffff));
        b.put_i32(len_i32(unrecognized_options.len()));
        for opt in unrecognized_options {
            put_cstr(b, opt.as_bytes());
        }
    });
}

/// CommandComplete with a command tag such as `SHOW` or `SELECT 3`.
pub fn encode_command_complete(buf: &mut BytesMut, tag: &str) {
    put_message(buf, tag::COMMAND_COMPLETE, |b| put_cstr(b, tag.as_bytes()));
}

/// RowDescription where every column is of type `text` in text format.
pub fn encode_row_description_text(buf: &mut BytesMut, columns: &[&str]) {
    encode_row_description(buf, columns.iter().map(|name| (*name, TEXT_OID, -1)));
}

/// RowDescription of columns given as (name, type OID, type size: -1 when variable), each
/// in text format and of no table.
pub fn encode_row_description<'a>(
    buf: &mut BytesMut,
    columns: impl ExactSizeIterator<Item = (&'a str, u32, i16)>,
) {
    put_message(buf, tag::ROW_DESCRIPTION, |b| {
        b.put_i16(len_i16(columns.len()));
        for (name, oid, size) in columns.take(i16::MAX as usize) {
            put_cstr(b, name.as_bytes());
            b.put_u32(0); // table OID
            b.put_i16(0); // column number
            b.put_u32(oid);
            b.put_i16(size);
            b.put_i32(-1); // type modifier
            b.put_i16(0); // text format
        }
    });
}

/// DataRow; `None` is SQL NULL.
pub fn encode_data_row(buf: &mut BytesMut, values: &[Option<&[u8]>]) {
    put_message(buf, tag::DATA_ROW, |b| {
        b.put_i16(len_i16(values.len()));
        for value in values.iter().take(i16::MAX as usize) {
            match value {
                Some(v) => {
                    b.put_i32(len_i32(v.len()));
                    b.put_slice(v);
                }
                None => b.put_i32(-1),
            }
        }
    });
}

/// EmptyQueryResponse.
pub fn encode_empty_query_response(buf: &mut BytesMut) {
    put_message(buf, tag::EMPTY_QUERY_RESPONSE, |_| {});
}

#[cfg(test)]
mod tests {
    use super::super::frame::decode_frame;
    use super::super::sqlstate;
    use super::*;

    fn frame_of(encode: impl FnOnce(&mut BytesMut)) -> Frame {
        let mut b = BytesMut::new();
        encode(&mut b);
        let f = decode_frame(&mut b, 1 << 20).unwrap().unwrap();
        assert!(b.is_empty());
        f
    }

    fn roundtrip(encode: impl FnOnce(&mut BytesMut)) -> Backend {
        decode_backend(&frame_of(encode)).unwrap()
    }

    #[test]
    fn auth_roundtrip() {
        let auth = |a| Backend::Auth(a);
        assert_eq!(roundtrip(encode_auth_ok), auth(AuthRequest::Ok));
        assert_eq!(
            roundtrip(encode_auth_cleartext),
            auth(AuthRequest::CleartextPassword)
        );
        assert_eq!(
            roundtrip(|b| encode_auth_md5(b, [1, 2, 3, 4])),
            auth(AuthRequest::Md5Password { salt: [1, 2, 3, 4] })
        );
        assert_eq!(
            roundtrip(|b| encode_auth_sasl(b, &["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"])),
            auth(AuthRequest::Sasl {
                mechanisms: vec!["SCRAM-SHA-256".into(), "SCRAM-SHA-256-PLUS".into()]
            })
        );
        assert_eq!(
            roundtrip(|b| encode_auth_sasl_continue(b, b"r=x")),
            auth(AuthRequest::SaslContinue {
                data: Bytes::from_static(b"r=x")
            })
        );
        assert_eq!(
            roundtrip(|b| encode_auth_sasl_final(b, b"v=y")),
            auth(AuthRequest::SaslFinal {
                data: Bytes::from_static(b"v=y")
            })
        );
        assert_eq!(
            roundtrip(|b| put_auth(b, 7, |_| {})),
            auth(AuthRequest::Other(7))
        );
    }

    #[test]
    fn session_messages_roundtrip() {
        assert_eq!(
            roundtrip(|b| encode_parameter_status(b, "TimeZone", "UTC")),
            Backend::ParameterStatus {
                name: "TimeZone".into(),
                value: "UTC".into()
            }
        );
        assert_eq!(
            roundtrip(|b| encode_backend_key_data(b, 9, b"\0\x01\x02\x03")),
            Backend::BackendKeyData {
                pid: 9,
                secret: Bytes::from_static(b"\0\x01\x02\x03")
            }
        );
        for s in [TxStatus::Idle, TxStatus::InTransaction, TxStatus::Failed] {
            assert_eq!(
                roundtrip(|b| encode_ready_for_query(b, s)),
                Backend::ReadyForQuery(s)
            );
        }
        assert_eq!(
            roundtrip(|b| encode_command_complete(b, "SELECT 1")),
            Backend::CommandComplete {
                tag: Bytes::from_static(b"SELECT 1")
            }
        );
        assert_eq!(
            roundtrip(encode_empty_query_response),
            Backend::EmptyQueryResponse
        );
    }

    #[test]
    fn error_roundtrip() {
        let e = ErrorResponse::fatal(sqlstate::TOO_MANY_CONNECTIONS, "too many")
            .with_detail("d")
            .with_hint("h");
        let Backend::ErrorResponse(f) = roundtrip(|b| encode_error(b, &e)) else {
            panic!("not an error");
        };
        assert_eq!(f.severity(), Some("FATAL"));
        assert_eq!(f.get(b'S'), Some("FATAL"));
        assert_eq!(f.code(), Some("53300"));
        assert_eq!(f.message(), Some("too many"));
        assert_eq!(f.get(b'D'), Some("d"));
        assert_eq!(f.get(b'H'), Some("h"));
        let n = ErrorResponse::new(Severity::Notice, sqlstate::INTERNAL_ERROR, "n");
        let Backend::NoticeResponse(f) = roundtrip(|b| encode_notice(b, &n)) else {
            panic!("not a notice");
        };
        assert_eq!(f.fields.len(), 4);
        assert_eq!(f.get(b'D'), None);
    }

    #[test]
    fn error_fields_found_in_place() {
        let mut b = BytesMut::new();
        encode_error(&mut b, &ErrorResponse::error(sqlstate::QUERY_CANCELED, "x"));
        let f = decode_frame(&mut b, 1 << 20).unwrap().unwrap();
        let body = f.body();
        assert_eq!(ErrorFields::find(&body, field::CODE), Some(&b"57014"[..]));
        assert_eq!(ErrorFields::find(&body, field::MESSAGE), Some(&b"x"[..]));
        assert_eq!(ErrorFields::find(&body, field::HINT), None);
        assert_eq!(ErrorFields::find(b"", field::CODE), None);
    }

    #[test]
    fn error_fields_rejections() {
        assert!(ErrorFields::parse(b"").is_err());
        assert!(ErrorFields::parse(b"Mabc").is_err());
        assert!(ErrorFields::parse(b"Mabc\0\0x").is_err());
        assert_eq!(ErrorFields::parse(b"\0").unwrap().fields, vec![]);
    }

    #[test]
    fn negotiate_protocol_version_layout() {
        let f = frame_of(|b| encode_negotiate_protocol_version(b, 2, &["_pq_.x".into()]));
        assert_eq!(
            decode_backend(&f).unwrap(),
            Backend::NegotiateProtocolVersion
        );
        assert_eq!(&f.body()[..], b"\x00\x03\x00\x02\x00\x00\x00\x01_pq_.x\0");
    }

    fn read_row_description(body: Bytes) -> Vec<(String, u32)> {
        let mut r = Reader::new(body);
        let n = r.i16("n").unwrap();
        let cols = (0..n)
            .map(|_| {
                let name = r.cstr_utf8("name").unwrap();
                r.take(6, "t").unwrap();
                let oid = r.u32("oid").unwrap();
                assert_eq!(
                    r.take(8, "rest").unwrap()[..],
                    [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0]
                );
                (name, oid)
            })
            .collect();
        r.finish("end").unwrap();
        cols
    }

    fn read_data_row(body: Bytes) -> Vec<Option<Vec<u8>>> {
        let mut r = Reader::new(body);
        let n = r.i16("n").unwrap();
        let vals = (0..n)
            .map(|_| match r.i32("len").unwrap() {
                -1 => None,
                len => Some(r.take(len as usize, "v").unwrap().to_vec()),
            })
            .collect();
        r.finish("end").unwrap();
        vals
    }

    #[test]
    fn result_set_roundtrip() {
        let f = frame_of(|b| encode_row_description_text(b, &["a", "bb"]));
        assert_eq!(decode_backend(&f).unwrap(), Backend::RowDescription);
        assert_eq!(
            read_row_description(f.body()),
            vec![("a".into(), 25), ("bb".into(), 25)]
        );
        let f = frame_of(|b| encode_data_row(b, &[Some(b"x"), None, Some(b"")]));
        assert_eq!(decode_backend(&f).unwrap(), Backend::DataRow);
        assert_eq!(
            read_data_row(f.body()),
            vec![Some(b"x".to_vec()), None, Some(vec![])]
        );
    }

    #[test]
    fn whole_messages_are_framed() {
        for (message, tag) in [
            (PARSE_COMPLETE_MESSAGE, tag::PARSE_COMPLETE),
            (CLOSE_COMPLETE_MESSAGE, tag::CLOSE_COMPLETE),
        ] {
            let mut b = BytesMut::new();
            put_message(&mut b, tag, |_| {});
            assert_eq!(message, &b[..]);
        }
    }

    #[test]
    fn row_description_with_types() {
        let f = frame_of(|b| encode_row_description(b, [("n", 23, 4)].into_iter()));
        assert_eq!(
            &f.raw()[..],
            b"T\0\0\0\x1a\0\x01n\0\0\0\0\0\0\0\0\0\0\x17\0\x04\xff\xff\xff\xff\0\0"
        );
    }

    #[test]
    fn backend_rejections() {
        let bad = |tag: u8, body: &'static [u8]| {
            let mut b = BytesMut::new();
            put_message(&mut b, tag, |b| b.put_slice(body));
            decode_backend(&decode_frame(&mut b, 100).unwrap().unwrap()).is_err()
        };
        assert!(bad(b'Z', b"Q"));
        assert!(bad(b'Z', b"II"));
        assert!(bad(b'R', b"\0\0"));
        assert!(bad(b'R', b"\0\0\0\x05ab"));
        assert!(bad(b'R', b"\0\0\0\x0aSCRAM\0"));
        assert!(bad(b'K', b"\0\0\0\x01ab"));
        assert!(bad(b'S', b"a\0b"));
        assert!(bad(b'C', b"SELECT"));
        assert!(!bad(b'D', b"anything"));
    }
}
