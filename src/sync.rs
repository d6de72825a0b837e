//! The one lock helper: a poison-tolerant `Mutex::lock`.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, recovering the data if a thread panicked while holding it: every critical
/// section in pgward keeps its state consistent and none can panic halfway, so the data of a
/// poisoned lock is as good as any.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
