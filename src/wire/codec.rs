//! Bounds-checked reading of message bodies and length-prefixed writing of messages.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::error::WireError;

/// Cursor over a message body. Every read checks the remaining length first and reports a
/// [`WireError::Malformed`] carrying the caller's description instead of panicking.
pub(crate) struct Reader {
    rest: Bytes,
}

impl Reader {
    pub(crate) fn new(body: Bytes) -> Self {
        Self { rest: body }
    }

    pub(crate) fn from_slice(body: &[u8]) -> Self {
        Self::new(Bytes::copy_from_slice(body))
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, WireError> {
        if n > self.rest.len() {
            return Err(WireError::Malformed(what));
        }
        Ok(self.rest.split_to(n))
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.take(N, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }

    #[cfg(test)]
    pub(crate) fn i16(&mut self, what: &'static str) -> Result<i16, WireError> {
        self.array(what).map(i16::from_be_bytes)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        self.array(what).map(u32::from_be_bytes)
    }

    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        self.array(what).map(i32::from_be_bytes)
    }

    /// A NUL-terminated string, returned without its terminator.
    pub(crate) fn cstr(&mut self, what: &'static str) -> Result<Bytes, WireError> {
        let end = memchr::memchr(0, &self.rest).ok_or(WireError::Malformed(what))?;
        let s = self.rest.split_to(end);
        self.rest.advance(1);
        Ok(s)
    }

    /// A NUL-terminated string that must be valid UTF-8.
    pub(crate) fn cstr_utf8(&mut self, what: &'static str) -> Result<String, WireError> {
        let raw = self.cstr(what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| WireError::Malformed(what))
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.rest)
    }

    /// Fails unless the whole body was consumed.
    pub(crate) fn finish(&self, what: &'static str) -> Result<(), WireError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed(what))
        }
    }
}

/// Writes a tagged message: the tag, a length word patched after `body` ran, then the body.
pub(crate) fn put_message(buf: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    put_untagged(buf, body);
}

/// Writes an untagged (startup-phase) message: a length word that counts itself, then the body.
pub(crate) fn put_untagged(buf: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    let at = buf.len();
    buf.put_u32(0);
    body(buf);
    let len = u32::try_from(buf.len() - at).unwrap_or(u32::MAX);
    if let Some(slot) = buf.get_mut(at..at + 4) {
        slot.copy_from_slice(&len.to_be_bytes());
    }
}

/// Writes `s` followed by a NUL. Anything from an embedded NUL on is dropped, so the message
/// framing always stays valid.
pub(crate) fn put_cstr(buf: &mut BytesMut, s: &[u8]) {
    let head = s.split(|&b| b == 0).next().unwrap_or_default();
    buf.put_slice(head);
    buf.put_u8(0);
}

/// Length of a slice as a protocol Int32, saturating (callers never produce 2 GiB fields).
pub(crate) fn len_i32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Count of items as a protocol Int16, saturating.
pub(crate) fn len_i16(n: usize) -> i16 {
    i16::try_from(n).unwrap_or(i16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reports_truncation() {
        let mut r = Reader::from_slice(b"ab\0\x00\x01");
        assert_eq!(r.cstr("s").unwrap(), Bytes::from_static(b"ab"));
        assert!(r.u32("n").is_err());
        assert_eq!(r.i16("n").unwrap(), 1);
        assert!(r.finish("end").is_ok());
        assert!(r.u8("x").is_err());
        assert!(r.cstr("s").is_err());
    }

    #[test]
    fn put_cstr_cuts_at_nul() {
        let mut b = BytesMut::new();
        put_cstr(&mut b, b"a\0b");
        assert_eq!(&b[..], b"a\0");
    }

    #[test]
    fn lengths_are_patched() {
        let mut b = BytesMut::new();
        put_message(&mut b, b'Q', |b| b.put_slice(b"xy"));
        assert_eq!(&b[..], b"Q\x00\x00\x00\x06xy");
    }
}
