//! Borrowed views of the client messages a pooler reads: each names the parts of a message
//! body in place, as slices of it, without copying or allocating. A view reads and checks
//! what its readers need, no more; [`super::decode_frontend`] checks the whole layout.

use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use super::{bind_params, tag, target};
use crate::wire::codec::{put_cstr, put_message};
use crate::wire::{split_cstr, WireError};

const PARSE_FORMAT: &str = "invalid Parse message format";
const BIND_PORTAL: &str = "invalid Bind message: missing portal name";
const BIND_STATEMENT: &str = "invalid Bind message: missing statement name";
const TARGET: &str = "invalid Describe or Close message";

/// A Query body: the query text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryView<'a> {
    /// The text without its terminating NUL (the whole body if that is missing).
    pub text: &'a [u8],
}

impl<'a> QueryView<'a> {
    /// Reads a Query body. Any body has a text: whether it is well formed (one NUL, at the
    /// end) is the server's to say.
    #[inline]
    pub fn new(body: &'a [u8]) -> Self {
        Self {
            text: body.strip_suffix(&[0]).unwrap_or(body),
        }
    }
}

/// A Parse body: the statement name, the query text and the parameter types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseView<'a> {
    /// The statement name without its NUL (empty for the unnamed statement).
    pub name: &'a [u8],
    /// The query text without its NUL.
    pub query: &'a [u8],
    /// What follows the query text: an Int16 count, then that many type OIDs.
    types: &'a [u8],
}

impl<'a> ParseView<'a> {
    /// Reads the statement name and the query text, each ending at its NUL. The parameter
    /// types after them are checked only by [`Self::param_types`].
    #[inline]
    pub fn new(body: &'a [u8]) -> Result<Self, WireError> {
        let (name, rest) = split_cstr(body).ok_or(WireError::Malformed(PARSE_FORMAT))?;
        let (query, types) = split_cstr(rest).ok_or(WireError::Malformed(PARSE_FORMAT))?;
        Ok(Self { name, query, types })
    }

    /// The parameter types as sent (the Int16 count and the OIDs), unchecked.
    pub fn raw_types(&self) -> &'a [u8] {
        self.types
    }

    /// The parameter type OIDs: an error unless the count is not negative and exactly that
    /// many OIDs end the body.
    pub fn param_types(&self) -> Result<ParamTypes<'a>, WireError> {
        let bad = || WireError::Malformed(PARSE_FORMAT);
        let (count, oids) = self.types.split_first_chunk::<2>().ok_or_else(bad)?;
        let count = usize::try_from(i16::from_be_bytes(*count)).map_err(|_| bad())?;
        if oids.len() != count * 4 {
            return Err(bad());
        }
        Ok(ParamTypes { oids })
    }
}

/// A Parse as the gate keeps it: slices of the message, never a copy.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The statement text, the bytes the server reads.
    pub text: Bytes,
    /// The parameter types as sent: count and OIDs.
    pub types: Bytes,
    /// The text as UTF-8 (`None`: it is not), checked at its first reading: a prepared
    /// statement run again is not checked again.
    sql: OnceLock<Option<ByteString>>,
}

impl PartialEq for Parsed {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text && self.types == other.types
    }
}

impl Eq for Parsed {}

impl Parsed {
    /// A Parse of `text` with parameter types `types` (count and OIDs).
    pub fn new(text: Bytes, types: Bytes) -> Self {
        Parsed {
            text,
            types,
            sql: OnceLock::new(),
        }
    }

    /// The Parse `parse` read from `body`.
    pub fn of(body: &Bytes, parse: &ParseView) -> Self {
        Parsed::new(
            body.slice_ref(parse.query),
            body.slice_ref(parse.raw_types()),
        )
    }

    /// The statement text when it is UTF-8, sharing the message's bytes.
    pub fn sql(&self) -> Option<&str> {
        self.sql
            .get_or_init(|| ByteString::try_from(self.text.clone()).ok())
            .as_deref()
    }

    /// The Parse of the whole message `message` (tag and length first).
    pub fn of_message(message: &Bytes) -> Option<Self> {
        let span = crate::wire::scan_frame(message, 0, usize::MAX)
            .ok()
            .flatten()?;
        let parse = ParseView::new(&message[span.body()]).ok()?;
        Some(Parsed::of(message, &parse))
    }
}

/// The parameter type OIDs of a Parse (0 leaves a type unspecified), in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamTypes<'a> {
    /// Four big-endian bytes each.
    oids: &'a [u8],
}

impl<'a> ParamTypes<'a> {
    /// How many there are.
    pub fn len(&self) -> usize {
        self.oids.len() / 4
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.oids.is_empty()
    }

    /// The OIDs in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u32> + 'a {
        self.oids
            .chunks_exact(4)
            .map(|oid| <[u8; 4]>::try_from(oid).map_or(0, u32::from_be_bytes))
    }
}

/// A Bind body: the portal and statement names, and the rest as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindView<'a> {
    /// The destination portal's name without its NUL.
    pub portal: &'a [u8],
    /// The source statement's name without its NUL.
    pub statement: &'a [u8],
    /// What follows the statement name, unchecked: the parameter format codes, the
    /// parameter values and the result format codes (see [`Self::params`]).
    pub rest: &'a [u8],
}

impl<'a> BindView<'a> {
    /// Reads the portal and statement names, each ending at its NUL.
    #[inline]
    pub fn new(body: &'a [u8]) -> Result<Self, WireError> {
        let (portal, rest) = split_cstr(body).ok_or(WireError::Malformed(BIND_PORTAL))?;
        let (statement, rest) = split_cstr(rest).ok_or(WireError::Malformed(BIND_STATEMENT))?;
        Ok(Self {
            portal,
            statement,
            rest,
        })
    }

    /// The parameter format codes and values at the front of [`Self::rest`], without the
    /// result format codes: an error when they are cut short.
    pub fn params(&self) -> Result<&'a [u8], WireError> {
        bind_params(self.rest)
    }

    /// Writes this Bind naming `statement` instead: the same portal and the same rest.
    pub fn encode_renamed(&self, buf: &mut BytesMut, statement: &[u8]) {
        // One allocation at most: the tag, the length, two names with their NULs, the rest.
        buf.reserve(1 + 4 + self.portal.len() + 1 + statement.len() + 1 + self.rest.len());
        put_message(buf, tag::BIND, |b| {
            put_cstr(b, self.portal);
            put_cstr(b, statement);
            b.put_slice(self.rest);
        });
    }
}

/// A Close body: what it closes, a statement or a portal, and its name. A Describe body has
/// the same layout and is read with it ([`DescribeView`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloseView<'a> {
    /// [`target::STATEMENT`] or [`target::PORTAL`].
    pub kind: u8,
    /// The name without its NUL.
    pub name: &'a [u8],
}

/// A Describe body: what it describes, a statement or a portal, and its name.
pub type DescribeView<'a> = CloseView<'a>;

impl<'a> CloseView<'a> {
    /// Reads the kind and the name ending at its NUL; an error for a kind other than
    /// [`target::STATEMENT`] or [`target::PORTAL`]. Anything after the NUL is left unread.
    #[inline]
    pub fn new(body: &'a [u8]) -> Result<Self, WireError> {
        let (&kind, rest) = body.split_first().ok_or(WireError::Malformed(TARGET))?;
        let (name, _) = split_cstr(rest).ok_or(WireError::Malformed(TARGET))?;
        if kind != target::STATEMENT && kind != target::PORTAL {
            return Err(WireError::Malformed(TARGET));
        }
        Ok(Self { kind, name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_text() {
        assert_eq!(QueryView::new(b"select 1\0").text, b"select 1");
        assert_eq!(QueryView::new(b"select 1").text, b"select 1");
        assert_eq!(QueryView::new(b"a\0b\0").text, b"a\0b");
        assert_eq!(QueryView::new(b"").text, b"");
    }

    #[test]
    fn a_parsed_text_is_read_as_utf8_in_place_or_not_at_all() {
        let types = Bytes::from_static(b"\0\0");
        let text = Bytes::from_static("select 'é'".as_bytes());
        let parsed = Parsed::new(text.clone(), types.clone());
        let sql = parsed.sql().unwrap();
        assert_eq!(sql, "select 'é'");
        assert!(std::ptr::eq(sql.as_bytes(), &text[..]));
        assert_eq!(parsed.sql().unwrap(), sql);
        let latin1 = Parsed::new(Bytes::from_static(b"select '\xe9'"), types.clone());
        assert_eq!(latin1.sql(), None);
        // Equal whether or not it was read yet.
        assert_eq!(parsed, Parsed::new(text, types));
    }

    #[test]
    fn parse_parts() {
        let p =
            ParseView::new(b"s1\0select $1, $2\0\x00\x02\x00\x00\x00\x17\x00\x00\x00\x00").unwrap();
        assert_eq!((p.name, p.query), (&b"s1"[..], &b"select $1, $2"[..]));
        assert_eq!(p.raw_types(), b"\x00\x02\x00\x00\x00\x17\x00\x00\x00\x00");
        let types = p.param_types().unwrap();
        assert_eq!((types.len(), types.is_empty()), (2, false));
        assert_eq!(types.iter().collect::<Vec<_>>(), [23, 0]);
        let none = ParseView::new(b"\0q\0\0\0").unwrap().param_types().unwrap();
        assert!(none.is_empty());
    }

    #[test]
    fn parse_rejections() {
        assert!(ParseView::new(b"s1").is_err());
        assert!(ParseView::new(b"s1\0q").is_err());
        for types in [
            &b""[..],
            b"\0",
            b"\0\x01",
            b"\xff\xff",
            b"\0\x01\0\0\0\x17\0",
            b"\0\0x",
        ] {
            let mut body = b"\0q\0".to_vec();
            body.extend_from_slice(types);
            let p = ParseView::new(&body).unwrap();
            assert_eq!(p.raw_types(), types);
            assert!(p.param_types().is_err(), "{types:?}");
        }
    }

    #[test]
    fn bind_parts() {
        let b = BindView::new(b"p1\0s1\0\0\0\0\0\0\0").unwrap();
        assert_eq!((b.portal, b.statement), (&b"p1"[..], &b"s1"[..]));
        assert_eq!(b.rest, b"\0\0\0\0\0\0");
        assert_eq!(b.params(), Ok(&b"\0\0\0\0"[..]));
        let cut = BindView::new(b"\0\0\0").unwrap();
        assert_eq!(cut.rest, b"\0");
        assert!(cut.params().is_err());
        let mut out = BytesMut::new();
        b.encode_renamed(&mut out, b"other");
        assert_eq!(&out[..], b"B\0\0\0\x13p1\0other\0\0\0\0\0\0\0");
        assert!(BindView::new(b"p1").is_err());
        assert!(BindView::new(b"p1\0s1").is_err());
    }

    #[test]
    fn close_parts() {
        let c = CloseView::new(b"Ss1\0").unwrap();
        assert_eq!((c.kind, c.name), (target::STATEMENT, &b"s1"[..]));
        let d = DescribeView::new(b"P\0after").unwrap();
        assert_eq!((d.kind, d.name), (target::PORTAL, &b""[..]));
        for body in [&b""[..], b"S", b"Ss1", b"X\0"] {
            assert!(CloseView::new(body).is_err(), "{body:?}");
        }
    }
}
