//! One-row queries with text parameters, sent with the extended protocol so a parameter is
//! never spliced into SQL (auth_query's `$1`).

use bytes::BytesMut;

use super::{ServerConn, ServerError};
use crate::params::Tracked;
use crate::wire::frontend::target;
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
        let values: Vec<&[u8]> = params.iter().map(|p| p.as_bytes()).collect();
        wire::encode_parse(&mut out, b"", sql.as_bytes(), &[]);
        wire::encode_bind_text(&mut out, b"", b"", &values);
        wire::encode_execute(&mut out, b"", 0);
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
        let mut out = encode_all(statements)?;
        wire::encode_sync(&mut out);
        let result = self.rows(&out, limit, tracked).await;
        if matches!(result, Ok(_) | Err(ServerError::Refused(_))) {
            let mut close = BytesMut::new();
            encode_closes(&mut close, statements);
            wire::encode_sync(&mut close);
            self.rows(&close, 0, tracked).await?;
        }
        result
    }

    /// [`own_batch`](Self::own_batch), or [`own_batch_in_open_batch`](Self::own_batch_in_open_batch)
    /// where the client has a batch open on this server.
    pub async fn own_statements(
        &mut self,
        statements: &[OwnStatement<'_>],
        limit: usize,
        in_open_batch: bool,
        tracked: &Tracked,
    ) -> Result<Vec<TextRow>, ServerError> {
        match in_open_batch {
            true => {
                self.own_batch_in_open_batch(statements, limit, tracked)
                    .await
            }
            false => self.own_batch(statements, limit, tracked).await,
        }
    }

    /// Runs pgward's own statements inside a batch the client has open on this server (its
    /// extended-protocol messages so far answered, no Sync yet): each under a name of its own,
    /// closed in the same batch, ended by a Flush instead of a Sync, so the client's implicit
    /// transaction goes on. Returns up to `limit` rows. An error is returned at once: the
    /// server then skips the client's messages up to the client's Sync, as it would after an
    /// error of the client's own.
    async fn own_batch_in_open_batch(
        &mut self,
        statements: &[OwnStatement<'_>],
        limit: usize,
        tracked: &Tracked,
    ) -> Result<Vec<TextRow>, ServerError> {
        let mut out = encode_all(statements)?;
        encode_closes(&mut out, statements);
        wire::encode_flush(&mut out);
        self.internal_busy = true;
        self.send(&out).await?;
        // One Close before each statement and two after.
        let mut closes = statements.len() * 3;
        let mut rows = Vec::new();
        while closes > 0 {
            let frame = self.read_frame().await?;
            if frame.tag() == wire::backend::tag::DATA_ROW {
                keep_row(&mut rows, limit, &frame.body())?;
                continue;
            }
            match wire::decode_backend(&frame)? {
                Backend::CloseComplete => closes -= 1,
                Backend::ErrorResponse(fields) => {
                    self.internal_busy = false;
                    return Err(ServerError::Refused(fields));
                }
                Backend::ParameterStatus { name, value } => {
                    self.note_parameter(&name, &value, tracked);
                }
                Backend::ReadyForQuery(_) | Backend::CopyInResponse | Backend::CopyBothResponse => {
                    self.reusable = false;
                    return Err(ServerError::Protocol(
                        "unexpected message in an internal query inside a batch",
                    ));
                }
                _ => {}
            }
        }
        self.internal_busy = false;
        Ok(rows)
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
                keep_row(&mut rows, limit, &frame.body())?;
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
        let params = wire::bind_params(self.values)
            .map_err(|_| ServerError::Protocol("malformed Bind parameters"))?;
        let name = self.name.as_bytes();
        wire::encode_parse_raw(out, name, self.sql.as_bytes(), self.types);
        // Every result column in text format.
        wire::encode_bind(out, name, name, params, &[]);
        wire::encode_execute(out, name, 0);
        Ok(())
    }
}

/// Parse, Bind and Execute of each statement, each after a Close of its name: a statement of
/// pgward's may be left on the server by a batch that failed before its Close (the server
/// skipped it), and a Close of a name that does not exist is no error.
fn encode_all(statements: &[OwnStatement<'_>]) -> Result<BytesMut, ServerError> {
    let mut out = BytesMut::new();
    for st in statements {
        wire::encode_close(&mut out, target::STATEMENT, st.name.as_bytes());
        st.encode(&mut out)?;
    }
    Ok(out)
}

/// Close of each statement's portal and statement.
fn encode_closes(out: &mut BytesMut, statements: &[OwnStatement<'_>]) {
    for st in statements {
        for kind in [target::PORTAL, target::STATEMENT] {
            wire::encode_close(out, kind, st.name.as_bytes());
        }
    }
}

/// Keeps the DataRow `body` in `rows` unless `limit` rows are there already.
fn keep_row(rows: &mut Vec<TextRow>, limit: usize, body: &[u8]) -> Result<(), ServerError> {
    if rows.len() < limit {
        let row = parse_data_row(body);
        rows.push(row.ok_or(ServerError::Protocol(
            "malformed DataRow in an internal query",
        ))?);
    }
    Ok(())
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
        let span = wire::scan_frame(&out, 0, usize::MAX).unwrap().unwrap();
        let body = &out[span.body()];
        assert_eq!(
            parse_data_row(body),
            Some(vec![Some("alice".into()), None, Some(String::new())])
        );
        assert_eq!(parse_data_row(&body[..body.len() - 1]), None);
        assert_eq!(parse_data_row(&[0, 1, 0x7f, 0xff, 0xff, 0xff]), None);
        assert_eq!(parse_data_row(&[]), None);
    }

    #[test]
    fn own_statements_are_parse_bind_execute_under_their_name() {
        // One text parameter ("ab"), then a binary result format the encoding replaces.
        let values = [0, 1, 0, 0, 0, 1, 0, 0, 0, 2, b'a', b'b', 0, 1, 0, 1];
        let st = OwnStatement {
            name: "n",
            sql: "SELECT $1",
            types: &[0, 1, 0, 0, 0, 25],
            values: &values,
        };
        let mut out = BytesMut::new();
        st.encode(&mut out).unwrap();
        let mut want = b"P\0\0\0\x16n\0SELECT $1\0\0\x01\0\0\0\x19".to_vec();
        want.extend_from_slice(b"B\0\0\0\x16n\0n\0\0\x01\0\0\0\x01\0\0\0\x02ab\0\0");
        want.extend_from_slice(b"E\0\0\0\x0an\0\0\0\0\0");
        assert_eq!(&out[..], &want[..]);
        let bad = OwnStatement {
            values: &values[..8],
            ..st
        };
        assert!(bad.encode(&mut BytesMut::new()).is_err());
    }
}
