//! The one lock helper: a poison-tolerant `Mutex::lock`.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, recovering the data if a thread panicked while holding it: every critical
/// section in pgward keeps its state consistent and none can panic halfway, so the data of a
/// poisoned lock is as good as any.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A value behind a lock with how often the lock was taken, counted under the lock (no
/// cache line of its own goes from core to core at each taking).
#[derive(Debug, Default)]
pub struct Counted<T> {
    value: T,
    taken: u64,
}

impl<T> Counted<T> {
    pub fn new(value: T) -> Self {
        Counted { value, taken: 0 }
    }

    /// Times the lock was taken through [`lock_counted`].
    pub fn taken(&self) -> u64 {
        self.taken
    }
}

impl<T> std::ops::Deref for Counted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for Counted<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

/// How often another thread held a lock when it was asked for (the taker then waited): the
/// contention of a lock shared by the worker threads.
#[derive(Debug, Default)]
pub struct Contended(std::sync::atomic::AtomicU64);

impl Contended {
    pub fn read(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// [`lock`], counted: in the value (taken) and in `contended` (found held).
pub fn lock_counted<'a, T>(
    m: &'a Mutex<Counted<T>>,
    contended: &Contended,
) -> MutexGuard<'a, Counted<T>> {
    use std::sync::TryLockError;
    let mut guard = match m.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => {
            contended
                .0
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            lock(m)
        }
    };
    guard.taken += 1;
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_lock_held_by_another_thread_counts_as_contended() {
        let m = Arc::new(Mutex::new(Counted::new(0u32)));
        let counts = Arc::new(Contended::default());
        let read = |m: &Mutex<Counted<u32>>, c: &Contended| (lock(m).taken(), c.read());
        **lock_counted(&m, &counts) += 1;
        assert_eq!(read(&m, &counts), (1, 0));
        let held = lock_counted(&m, &counts);
        let barrier = Arc::new(Barrier::new(2));
        let other = {
            let (m, counts, barrier) = (m.clone(), counts.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                **lock_counted(&m, &counts) += 1;
            })
        };
        barrier.wait();
        // The other thread finds the lock held until the count says so.
        while counts.read() == 0 {
            std::thread::yield_now();
        }
        drop(held);
        other.join().unwrap();
        assert_eq!(read(&m, &counts), (3, 1));
        assert_eq!(**lock(&m), 2);
    }
}
