//! One-row queries with text parameters, sent with the extended protocol so a parameter is
//! never spliced into SQL (auth_query's `$1`).

use bytes::{BufMut, BytesMut};

use super::{ServerConn, ServerError};
use crate::params::Tracked;
use crate::wire::{self, Backend};

/// A row of text values; `None` is SQL NULL.
pub type TextRow = Vec<Option<String>>;

impl ServerConn {
    /// Runs `sql` with `params` as text and returns its first row, reading to ReadyForQuery.
    /// An error from the server is returned after ReadyForQuery, so the connection stays in
    /// step.
    pub async fn query_row(
        &mut self,
        sql: &str,
        params: &[&str],
        tracked: &Tracked,
    ) -> Result<Option<TextRow>, ServerError> {
        let mut out = BytesMut::new();
        wire::encode_parse(&mut out, b"", sql.as_bytes(), &[]);
        encode_bind_text(&mut out, params);
        encode_execute(&mut out);
        wire::encode_sync(&mut out);
        self.first_row(&out, tracked).await
    }

    /// Runs pgward's own statements as one extended-protocol batch, each under a name of
    /// its own (statement and portal, closed afterwards in a batch of their own), so the
    /// client's unnamed statement and portal are never touched. Returns up to `limit` rows
    /// of what they returned; the first error after ReadyForQuery.
    pub async fn own_batch(
        &mut self,
        statements: &[OwnStatement<'_>],
        limit: usize,
        tracked: &Tracked,
    ) -> Result<Vec<TextRow>, ServerError> {
        let mut out = BytesMut::new();
        for st in statements {
            st.encode(&mut out)?;
        }
        wire::encode_sync(&mut out);
        let result = self.rows(&out, limit, tracked).await;
        if matches!(result, Ok(_) | Err(ServerError::Refused(_))) {
            let mut close = BytesMut::new();
            for st in statements {
                for kind in [b'P', b'S'] {
                    let mut body = vec![kind];
                    body.extend_from_slice(st.name.as_bytes());
                    body.push(0);
                    put_tagged(&mut close, b'C', &body);
                }
            }
            wire::encode_sync(&mut close);
            self.rows(&close, 0, tracked).await?;
        }
        result
    }

    /// Sends `out` (ending with Sync) and reads its first DataRow, up to ReadyForQuery.
    async fn first_row(
        &mut self,
        out: &[u8],
        tracked: &Tracked,
    ) -> Result<Option<TextRow>, ServerError> {
        Ok(self.rows(out, 1, tracked).await?.into_iter().next())
    }

    /// Sends `out` (ending with Sync) and reads up to `limit` DataRows, up to ReadyForQuery.
    async fn rows(
        &mut self,
        out: &[u8],
        limit: usize,
        tracked: &Tracked,
    ) -> Result<Vec<TextRow>, ServerError> {
        self.internal_busy = true;
        self.send(out).await?;
        let mut rows = Vec::new();
        let mut failure = None;
        loop {
            let frame = self.read_frame().await?;
            if frame.tag() == wire::backend::tag::DATA_ROW {
                if rows.len() < limit {
                    rows.push(parse_data_row(&frame.body()).ok_or(ServerError::Protocol(
                        "malformed DataRow in an internal query",
                    ))?);
                }
                continue;
            }
            match wire::decode_backend(&frame)? {
                Backend::ReadyForQuery(status) => {
                    self.tx = status;
                    self.internal_busy = false;
                    return failure.map_or(Ok(rows), |f| Err(ServerError::Refused(f)));
                }
                Backend::ErrorResponse(fields) => {
                    failure.get_or_insert(fields);
                }
                Backend::ParameterStatus { name, value } => {
                    self.note_parameter(&name, &value, tracked);
                }
                Backend::CopyInResponse | Backend::CopyBothResponse => {
                    self.reusable = false;
                    return Err(ServerError::Protocol(
                        "unexpected COPY in an internal query",
                    ));
                }
                _ => {}
            }
        }
    }
}

/// One of pgward's own statements: a name (used for its statement and its portal), the
/// text, the parameter types as a Parse carries them (count and OIDs) and the parameters as
/// a Bind carries them after the statement name (formats and values; result formats, if
/// any, are replaced by text).
#[derive(Clone, Copy, Debug)]
pub struct OwnStatement<'a> {
    pub name: &'a str,
    pub sql: &'a str,
    pub types: &'a [u8],
    pub values: &'a [u8],
}

impl<'a> OwnStatement<'a> {
    /// A statement without parameters.
    pub fn plain(name: &'a str, sql: &'a str) -> Self {
        OwnStatement {
            name,
            sql,
            types: &[0, 0],
            values: &[0, 0, 0, 0],
        }
    }

    fn encode(&self, out: &mut BytesMut) -> Result<(), ServerError> {
        let params = bind_parameters(self.values)
            .ok_or(ServerError::Protocol("malformed Bind parameters"))?;
        let name = self.name.as_bytes();
        let mut parse = BytesMut::new();
        parse.put_slice(name);
        parse.put_u8(0);
        parse.put_slice(self.sql.as_bytes());
        parse.put_u8(0);
        parse.put_slice(self.types);
        put_tagged(out, b'P', &parse);
        let mut bind = BytesMut::new();
        for _ in 0..2 {
            bind.put_slice(name);
            bind.put_u8(0);
        }
        bind.put_slice(params);
        bind.put_i16(0); // result formats: all text
        put_tagged(out, b'B', &bind);
        let mut execute = name.to_vec();
        execute.extend_from_slice(&[0, 0, 0, 0, 0]);
        put_tagged(out, b'E', &execute);
        Ok(())
    }
}

/// The parameter formats and values at the front of a Bind's tail (after the statement
/// name), without the result formats; `None` if malformed.
fn bind_parameters(tail: &[u8]) -> Option<&[u8]> {
    let (formats, mut rest) = split_u16(tail)?;
    rest = rest.get(usize::from(formats) * 2..)?;
    let (count, mut values) = split_u16(rest)?;
    for _ in 0..count {
        let (len, after) = split_i32(values)?;
        values = match usize::try_from(len) {
            Ok(n) => after.get(n..)?,
            Err(_) => after, // NULL
        };
    }
    let used = tail.len() - values.len();
    tail.get(..used)
}

/// Bind of the unnamed statement to the unnamed portal, every parameter as text.
fn encode_bind_text(buf: &mut BytesMut, params: &[&str]) {
    let mut body = BytesMut::new();
    body.put_u8(0); // portal
    body.put_u8(0); // statement
    body.put_i16(0); // parameter formats: all text
    body.put_i16(i16::try_from(params.len()).unwrap_or(i16::MAX));
    for p in params.iter().take(i16::MAX as usize) {
        body.put_i32(i32::try_from(p.len()).unwrap_or(i32::MAX));
        body.put_slice(p.as_bytes());
    }
    body.put_i16(0); // result formats: all text
    put_tagged(buf, b'B', &body);
}

/// Execute of the unnamed portal, all rows.
fn encode_execute(buf: &mut BytesMut) {
    put_tagged(buf, b'E', &[0, 0, 0, 0, 0]);
}

fn put_tagged(buf: &mut BytesMut, tag: u8, body: &[u8]) {
    buf.put_u8(tag);
    buf.put_i32(i32::try_from(body.len() + 4).unwrap_or(i32::MAX));
    buf.put_slice(body);
}

/// The values of a DataRow body, or `None` if it is malformed.
fn parse_data_row(body: &[u8]) -> Option<TextRow> {
    let (count, mut rest) = split_u16(body)?;
    let mut row = Vec::with_capacity(usize::from(count).min(64));
    for _ in 0..count {
        let (len, after) = split_i32(rest)?;
        rest = after;
        if len < 0 {
            row.push(None);
            continue;
        }
        let len = usize::try_from(len).ok()?;
        if rest.len() < len {
            return None;
        }
        let (value, after) = rest.split_at(len);
        rest = after;
        row.push(Some(String::from_utf8_lossy(value).into_owned()));
    }
    Some(row)
}

fn split_u16(b: &[u8]) -> Option<(u16, &[u8])> {
    let (head, rest) = b.split_first_chunk::<2>()?;
    Some((u16::from_be_bytes(*head), rest))
}

fn split_i32(b: &[u8]) -> Option<(i32, &[u8])> {
    let (head, rest) = b.split_first_chunk::<4>()?;
    Some((i32::from_be_bytes(*head), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_rows() {
        let mut out = BytesMut::new();
        wire::encode_data_row(&mut out, &[Some(b"alice"), None, Some(b"")]);
        let body = &out[5..];
        assert_eq!(
            parse_data_row(body),
            Some(vec![Some("alice".into()), None, Some(String::new())])
        );
        assert_eq!(parse_data_row(&body[..body.len() - 1]), None);
        assert_eq!(parse_data_row(&[0, 1, 0x7f, 0xff, 0xff, 0xff]), None);
        assert_eq!(parse_data_row(&[]), None);
    }

    #[test]
    fn bind_parameters_stop_before_result_formats() {
        // one format (text), two values ("ab", NULL), one result format (binary)
        let tail = [
            0, 1, 0, 0, 0, 2, 0, 0, 0, 2, b'a', b'b', 0xff, 0xff, 0xff, 0xff, 0, 1, 0, 1,
        ];
        assert_eq!(bind_parameters(&tail), Some(&tail[..16]));
        assert_eq!(bind_parameters(&tail[..11]), None);
        assert_eq!(bind_parameters(&[0, 5]), None);
    }

    #[test]
    fn bind_is_framed() {
        let mut out = BytesMut::new();
        encode_bind_text(&mut out, &["bob"]);
        assert_eq!(out[0], b'B');
        let len = i32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        assert_eq!(len + 1, out.len());
    }
}
