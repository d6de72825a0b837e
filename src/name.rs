//! Names shared as `Arc<str>` (databases, roles, tenants), compared by address first.

/// Whether `a` and `b` say the same name: the same bytes in memory, or equal bytes.
/// (`Arc<str>`'s own `==` compares the bytes every time, even of one allocation.)
pub fn same(a: &str, b: &str) -> bool {
    (std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()) || a == b
}

#[cfg(test)]
mod tests {
    use super::same;
    use std::sync::Arc;

    #[test]
    fn one_allocation_or_equal_bytes_are_the_same_name() {
        let a: Arc<str> = Arc::from("acme");
        assert!(same(&a, &Arc::clone(&a)));
        assert!(same(&a, &Arc::from("acme")));
        assert!(!same(&a, &Arc::from("acm")));
        assert!(!same(&a, &a[..3]));
        assert!(same("", &Arc::from("")));
    }
}
