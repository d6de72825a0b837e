//! The one lock helper: a poison-tolerant `Mutex::lock`.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, recovering the data if a thread panicked while holding it: every critical
/// section in pgward keeps its state consistent and none can panic halfway, so the data of a
/// poisoned lock is as good as any.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How often a lock was taken, and how often another thread held it at that moment (the
/// taker then waited): the contention of a lock shared by the worker threads.
#[derive(Debug, Default)]
pub struct LockCounts {
    taken: std::sync::atomic::AtomicU64,
    contended: std::sync::atomic::AtomicU64,
}

impl LockCounts {
    /// Times taken, and times it was held by another thread when asked for.
    pub fn read(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.taken.load(Relaxed), self.contended.load(Relaxed))
    }
}

/// [`lock`], counted in `counts`.
pub fn lock_counted<'a, T>(m: &'a Mutex<T>, counts: &LockCounts) -> MutexGuard<'a, T> {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::TryLockError;
    counts.taken.fetch_add(1, Relaxed);
    match m.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => {
            counts.contended.fetch_add(1, Relaxed);
            lock(m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_lock_held_by_another_thread_counts_as_contended() {
        let m = Arc::new(Mutex::new(0u32));
        let counts = Arc::new(LockCounts::default());
        *lock_counted(&m, &counts) += 1;
        assert_eq!(counts.read(), (1, 0));
        let held = lock_counted(&m, &counts);
        let barrier = Arc::new(Barrier::new(2));
        let other = {
            let (m, counts, barrier) = (m.clone(), counts.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                *lock_counted(&m, &counts) += 1;
            })
        };
        barrier.wait();
        // The other thread finds the lock held until the count says so.
        while counts.read().1 == 0 {
            std::thread::yield_now();
        }
        drop(held);
        other.join().unwrap();
        assert_eq!(counts.read(), (3, 1));
        assert_eq!(*lock(&m), 2);
    }
}
