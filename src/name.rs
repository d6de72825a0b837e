//! Names shared as `Arc<str>` (databases, roles, tenants), compared by address first.

/// Whether `a` and `b` say the same name: the same bytes in memory, or equal bytes.
/// (`Arc<str>`'s own `==` compares the bytes every time, even of one allocation.)
#[inline]
pub fn same(a: &str, b: &str) -> bool {
    same_bytes(a.as_bytes(), b.as_bytes())
}

/// [`same`] for bytes: a text read earlier and the message's own bytes, say.
#[inline]
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    (std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()) || a == b
}

#[cfg(test)]
mod tests {
    use super::{same, same_bytes};
    use std::sync::Arc;

    #[test]
    fn one_allocation_or_equal_bytes_are_the_same_name() {
        let a: Arc<str> = Arc::from("acme");
        assert!(same(&a, &Arc::clone(&a)));
        assert!(same(&a, &Arc::from("acme")));
        assert!(!same(&a, &Arc::from("acm")));
        assert!(!same(&a, &a[..3]));
        assert!(same("", &Arc::from("")));
        let text = b"SELECT 1".to_vec();
        assert!(same_bytes(&text, &text));
        assert!(same_bytes(&text, b"SELECT 1"));
        assert!(!same_bytes(&text, &text[..7]));
    }
}
