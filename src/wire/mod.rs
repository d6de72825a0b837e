//! The sans-IO wire codec: framing, typed decoding and encoding of PostgreSQL protocol 3
//! messages, SQLSTATE codes, and the password authentication math. Nothing here does I/O.
//!
//! Everything else reads and writes protocol bytes through here: message types by direction
//! ([`frontend::tag`], [`backend::tag`]), headers through [`scan_frame`], the client messages
//! the relay reads through borrowed views ([`ParseView`], [`BindView`], [`CloseView`],
//! [`QueryView`]).

pub mod auth;
pub mod backend;
mod codec;
pub mod error;
pub mod frame;
pub mod frontend;
pub mod sqlstate;

#[cfg(test)]
mod proptests;

pub use auth::{
    ct_eq, md5_response, md5_response_from_password, md5_secret, md5_verify, random_md5_salt,
    random_nonce, ScramClient, ScramCredential, ScramError, ScramOutcome, ScramSecret, ScramServer,
    DEFAULT_SCRAM_ITERATIONS, MAX_SCRAM_ITERATIONS, SCRAM_SHA_256,
};
pub use backend::{
    decode_backend, encode_auth_cleartext, encode_auth_md5, encode_auth_ok, encode_auth_sasl,
    encode_auth_sasl_continue, encode_auth_sasl_final, encode_backend_key_data,
    encode_command_complete, encode_data_row, encode_empty_query_response, encode_error,
    encode_error_reworded, encode_negotiate_protocol_version, encode_notice,
    encode_parameter_status, encode_ready_for_query, encode_row_description,
    encode_row_description_text, AuthRequest, Backend, ErrorFields, ErrorResponse, Severity,
    TxStatus,
};
pub use error::WireError;
pub use frame::{
    decode_frame, decode_startup, encode_startup_packet, room_for_read, scan_frame, BadFrameLength,
    Frame, FrameHeader, FrameSpan, StartupPacket, CANCEL_REQUEST_CODE, DEFAULT_MAX_MESSAGE_LEN,
    ENCRYPTION_ACCEPTED, ENCRYPTION_REFUSED, GSSENC_REQUEST_CODE, HEADER_LEN,
    MAX_CANCEL_SECRET_LEN, MAX_STARTUP_PACKET_LEN, PROTOCOL_3_0, SSL_REQUEST_CODE,
};
pub use frontend::{
    bind_params, decode_frontend, encode_bind, encode_bind_text, encode_cancel_request,
    encode_close, encode_describe, encode_execute, encode_flush, encode_parse, encode_parse_raw,
    encode_password, encode_query, encode_sasl_initial, encode_sasl_response, encode_ssl_request,
    encode_startup, encode_sync, encode_terminate, parse_password, parse_sasl_initial, BindView,
    CloseView, DescribeView, Frontend, ParamTypes, ParseView, Parsed, QueryView,
};

/// Splits a NUL-terminated string off the front of `buf`: the string without its NUL, and
/// what follows the NUL.
pub fn split_cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    // Most names are empty (the unnamed statement and portal): answered before a search.
    let nul = match buf.first() {
        Some(0) => 0,
        _ => memchr::memchr(0, buf)?,
    };
    Some((&buf[..nul], &buf[nul + 1..]))
}
